#include "meshtrain/comm/device_mesh.h"

#include <fmt/format.h>

#include <algorithm>

#include "meshtrain/core/error.h"

namespace meshtrain {

DeviceMesh::DeviceMesh(const MeshShape& shape, const ProcessGroup& world)
    : shape_(shape), rank_(world.rank()), coords_(shape.coords_of(world.rank())) {
  MT_CHECK(world.size() == shape.world_size(), "mesh {} needs {} ranks, the group has {}",
           shape.to_string(), shape.world_size(), world.size());
  for (const Axis axis : kAllAxes) {
    // Key = rank: within a group, ranks are ordered like their world ranks, which is the
    // order of the varying coordinate (all other coordinates are equal).
    groups_[static_cast<std::size_t>(axis)] =
        world.split(shape.group_index(axis, rank_), rank_, std::string(meshtrain::to_string(axis)));
  }
  // With cp = 1 the dp × cp group is the dp group itself (one set of counters, one watchdog
  // name); every rank has the same shape, so all or none take part in the split.
  if (shape.cp > 1) {
    dp_cp_ = world.split(shape.group_index({Axis::dp, Axis::cp}, rank_), rank_, "dp_cp");
  }
  if (shape.ep > 1) edp_ = world.split(shape.expert_dp_group_index(rank_), rank_, "edp");
  if (shape.tp > 1 && shape.cp > 1) {
    tp_cp_ = world.split(shape.group_index({Axis::tp, Axis::cp}, rank_), rank_, "tp_cp");
  }
}

std::string DeviceMesh::describe() const {
  return fmt::format("rank {} (pp={} dp={} cp={} tp={})", rank_, coords_.pp, coords_.dp, coords_.cp,
                     coords_.tp);
}

}  // namespace meshtrain
