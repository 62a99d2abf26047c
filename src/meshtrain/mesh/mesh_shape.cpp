#include "meshtrain/mesh/mesh_shape.h"

#include <fmt/format.h>

#include <algorithm>

#include "meshtrain/core/error.h"

namespace meshtrain {

std::string_view to_string(Axis axis) {
  constexpr std::array<std::string_view, kAllAxes.size()> names{"pp", "dp", "cp", "tp", "ep"};
  const auto i = static_cast<std::size_t>(axis);
  return i < names.size() ? names[i] : "?";
}

int MeshShape::size(Axis axis) const noexcept {
  const std::array<int, kAllAxes.size()> sizes{pp, dp, cp, tp, ep};  // Axis order
  const auto i = static_cast<std::size_t>(axis);
  return i < sizes.size() ? sizes[i] : 1;
}

MeshCoords MeshShape::coords_of(int rank) const {
  MT_CHECK(rank >= 0 && rank < world_size(), "rank {} outside mesh {}", rank, to_string());
  MeshCoords c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp = (rank / (tp * cp)) % dp;
  c.pp = rank / (tp * cp * dp);
  return c;
}

int MeshShape::group_index(std::initializer_list<Axis> axes, int rank) const {
  const MeshCoords c = coords_of(rank);
  const std::pair<Axis, std::pair<int, int>> coords[] = {{Axis::pp, {c.pp, pp}},
                                                         {Axis::dp, {c.dp, dp}},
                                                         {Axis::cp, {c.cp, cp}},
                                                         {Axis::tp, {c.tp, tp}}};
  for (const Axis a : axes) {
    MT_CHECK(a != Axis::ep, "ep groups are carved out of dp; use groups(Axis::ep)");
  }
  // The coordinates that stay fixed within a group identify it (mixed radix, pp slowest).
  int index = 0;
  for (const auto& [axis, value_size] : coords) {
    if (std::find(axes.begin(), axes.end(), axis) != axes.end()) continue;
    index = index * value_size.second + value_size.first;
  }
  return index;
}

int MeshShape::group_index(Axis axis, int rank) const {
  if (axis != Axis::ep) return group_index({axis}, rank);
  const MeshCoords c = coords_of(rank);
  return ((c.pp * (dp / ep) + c.dp / ep) * cp + c.cp) * tp + c.tp;
}

std::vector<std::vector<int>> MeshShape::groups(std::initializer_list<Axis> axes) const {
  int n = 1;
  for (const Axis a : axes) n *= size(a);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(world_size() / n));
  for (int rank = 0; rank < world_size(); ++rank) {
    out[static_cast<std::size_t>(group_index(axes, rank))].push_back(rank);
  }
  return out;
}

std::vector<std::vector<int>> MeshShape::groups(Axis axis) const {
  if (axis != Axis::ep) return groups({axis});
  std::vector<std::vector<int>> out(static_cast<std::size_t>(world_size() / ep));
  for (int rank = 0; rank < world_size(); ++rank) {
    out[static_cast<std::size_t>(group_index(axis, rank))].push_back(rank);
  }
  return out;
}

int MeshShape::expert_dp_group_index(int rank) const {
  const MeshCoords c = coords_of(rank);
  return (c.pp * ep + c.dp % ep) * tp + c.tp;
}

std::vector<std::vector<int>> MeshShape::expert_dp_groups() const {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(pp * ep * tp));
  for (int rank = 0; rank < world_size(); ++rank) {
    out[static_cast<std::size_t>(expert_dp_group_index(rank))].push_back(rank);
  }
  return out;
}

std::string MeshShape::to_string() const {
  return fmt::format("pp={} dp={} cp={} tp={} ep={}", pp, dp, cp, tp, ep);
}

}  // namespace meshtrain
