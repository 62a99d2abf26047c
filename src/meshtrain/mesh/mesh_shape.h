// src/meshtrain/mesh/mesh_shape.h
//
// The mesh of ranks as pure arithmetic: world = pp × dp × cp × tp, rank = ((p·dp + d)·cp + c)·tp + t
// (tp fastest, pp slowest: the most talkative axis stays inside a node, as Megatron-LM's
// default order). Expert parallel ep is carved out of dp (ep | dp; the ep ranks sharing an
// expert set are consecutive in dp). No communication: comm/device_mesh.h builds the groups,
// the placement table (mesh/placement.h) and the planner read the shape.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

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

}  // namespace meshtrain
