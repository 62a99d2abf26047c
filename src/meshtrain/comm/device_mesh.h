// src/meshtrain/comm/device_mesh.h
//
// The mesh of ranks: world = pp × dp × cp × tp, rank = ((p·dp + d)·cp + c)·tp + t (tp fastest,
// pp slowest: the most talkative axis stays inside a node, as Megatron-LM's default order).
// Expert parallel ep is carved out of dp (ep | dp; the ep ranks sharing an expert set are
// consecutive in dp). MeshShape is the pure arithmetic; DeviceMesh builds one ProcessGroup per
// axis from it. Knows nothing of models.
#pragma once

#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"

namespace meshtrain {

enum class Axis : std::uint8_t { pp, dp, cp, tp, ep };  // device-mesh axes (not tensor dims)
inline constexpr std::array<Axis, 5> kAllAxes = {Axis::pp, Axis::dp, Axis::cp, Axis::tp, Axis::ep};
std::string_view to_string(Axis axis);

struct MeshCoords {
  int pp = 0, dp = 0, cp = 0, tp = 0;
  bool operator==(const MeshCoords&) const = default;
};

struct MeshShape {
  int pp = 1, dp = 1, cp = 1, tp = 1, ep = 1;

  int world_size() const noexcept { return pp * dp * cp * tp; }
  int size(Axis axis) const noexcept;
  MeshCoords coords_of(int rank) const;
  int rank_of(const MeshCoords& c) const noexcept {
    return ((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp;
  }
  /// Every group of `axis`, each as world ranks in group-rank order; together they partition
  /// the world. For ep: ranks that differ only in dp index d within one block of ep
  /// consecutive d values.
  std::vector<std::vector<int>> groups(Axis axis) const;
  /// Index of the group of `axis` that `rank` belongs to (its position in groups(axis)).
  int group_index(Axis axis, int rank) const;
  /// Groups spanning several mesh axes at once (e.g. {dp, cp}, over which gradients are
  /// reduced under context parallelism): the ranks whose coordinates agree on every other
  /// axis, in ascending rank order. `axes` ⊆ {pp, dp, cp, tp}; MT_CHECK otherwise.
  std::vector<std::vector<int>> groups(std::initializer_list<Axis> axes) const;
  int group_index(std::initializer_list<Axis> axes, int rank) const;
  /// The expert-data-parallel groups (Megatron-core's expert data parallel): the dp × cp ranks
  /// with the same ep rank (d mod ep), which hold the same experts and see different tokens,
  /// (dp·cp)/ep ranks each, in ascending rank order (group rank (d div ep)·cp + c). Equal to
  /// groups({dp, cp}) when ep = 1.
  std::vector<std::vector<int>> expert_dp_groups() const;
  int expert_dp_group_index(int rank) const;
  std::string to_string() const;
};

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
