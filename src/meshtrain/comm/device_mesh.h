// src/meshtrain/comm/device_mesh.h
//
// DeviceMesh builds one ProcessGroup per axis of a MeshShape (mesh/mesh_shape.h: the rank
// arithmetic), plus the combined groups gradient reduction needs. Knows nothing of models.
#pragma once

#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/mesh/mesh_shape.h"

namespace meshtrain {

/// One ProcessGroup per axis for this rank. Construction is collective over `world`.
class DeviceMesh {
 public:
  /// `world` must have shape.world_size() ranks (a bug otherwise: configs are validated first).
  DeviceMesh(const MeshShape& shape, const ProcessGroup& world);

  const MeshShape& shape() const noexcept { return shape_; }
  int rank() const noexcept { return rank_; }
  const MeshCoords& coords() const noexcept { return coords_; }
  ProcessGroup& group(Axis axis) const { return *groups_[static_cast<std::size_t>(axis)]; }
  /// The dp × cp group (gradient reduction when context parallelism splits sequences): the
  /// dp group itself when cp = 1.
  ProcessGroup& dp_cp_group() const { return dp_cp_ ? *dp_cp_ : group(Axis::dp); }
  /// The expert-data-parallel group (MeshShape::expert_dp_groups): experts' gradients are
  /// reduced and their ZeRO state sliced over it. The dp × cp group itself when ep = 1.
  ProcessGroup& expert_dp_group() const { return edp_ ? *edp_ : dp_cp_group(); }
  /// The tp × cp group (the ranks holding parts of one micro-batch under sequence and context
  /// parallelism): the tp or cp group itself when the other is 1.
  ProcessGroup& tp_cp_group() const {
    return tp_cp_ ? *tp_cp_ : shape_.cp > 1 ? group(Axis::cp) : group(Axis::tp);
  }
  /// "rank 3 (pp=0 dp=1 cp=0 tp=1)" for reports.
  std::string describe() const;

 private:
  MeshShape shape_;
  int rank_;
  MeshCoords coords_;
  std::array<std::unique_ptr<ProcessGroup>, 5> groups_;
  std::unique_ptr<ProcessGroup> dp_cp_;  // cp > 1 only
  std::unique_ptr<ProcessGroup> edp_;    // ep > 1 only
  std::unique_ptr<ProcessGroup> tp_cp_;  // tp > 1 and cp > 1 only
};

}  // namespace meshtrain
