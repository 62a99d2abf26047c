// src/meshtrain/layers/placement.h
//
// The one rule that turns a parameter's placement (layers/parameter.h: tp shard, replica
// group, tied copy) into "which rank's copy of an element counts": the grad norm sums each
// logical element once, a checkpoint saves it once, the offline reshard writes it once. A
// copy counts on tp rank 0 unless the parameter is sharded over tp (then every tp rank holds
// different elements), never for a tied copy, and on replica 0 of its replica group unless
// ZeRO slices the optimizer state (then each replica owns a disjoint slice, and the slices
// are what the callers iterate). pp and ep need no term: a stage or an ep rank holds its
// parameters alone, so its copy is the only one.
#pragma once

#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// This rank's positions in the groups a placement refers to.
struct PlacementRanks {
  int tp = 0;      // rank in the tp group
  int dense = 0;   // rank in the dp × cp group
  int expert = 0;  // rank in the expert-data-parallel group
  int replica(ReplicaGroup g) const { return g == ReplicaGroup::expert ? expert : dense; }
};

/// The ranks of world rank `rank` in a mesh of `shape`, by arithmetic (for tools that write a
/// layout's checkpoint without running it): dense = its rank in the dp × cp group, d·cp + c;
/// expert = its rank in the expert-data-parallel group, (d div ep)·cp + c
/// (MeshShape::expert_dp_groups).
inline PlacementRanks placement_ranks(const MeshShape& shape, int rank) {
  const MeshCoords c = shape.coords_of(rank);
  return {.tp = c.tp, .dense = c.dp * shape.cp + c.cp, .expert = c.dp / shape.ep * shape.cp + c.cp};
}

/// Ranks in replica group g of a mesh of `shape`: dp·cp, or (dp·cp)/ep for experts.
inline int replica_count(const MeshShape& shape, ReplicaGroup g) {
  return g == ReplicaGroup::expert ? shape.dp * shape.cp / shape.ep : shape.dp * shape.cp;
}

/// Whether this rank's copy of p's optimizer shard is the one that counts (see above).
/// `zero_sliced`: ZeRO stage ≥ 1 (each replica holds its own slice).
inline bool counts_this_copy(const Parameter& p, const PlacementRanks& ranks, bool zero_sliced) {
  if (p.tied_copy) return false;
  if (!p.is_sharded() && ranks.tp != 0) return false;
  return zero_sliced || ranks.replica(p.replicas) == 0;
}

/// The groups of this rank a placement refers to; `pp` completes the set whose all-reduces
/// span the whole world: world = pp × dp × cp × tp, and ep and the expert-data-parallel groups
/// lie inside dp × cp.
struct PlacementGroups {
  ProcessGroup& tp;
  ProcessGroup& pp;
  ProcessGroup& dense;   // dp × cp
  ProcessGroup& expert;  // expert data parallel (= dense when ep = 1)
  ProcessGroup& replicas(ReplicaGroup g) const {
    return g == ReplicaGroup::expert ? expert : dense;
  }
  PlacementRanks ranks() const { return {tp.rank(), dense.rank(), expert.rank()}; }
};

}  // namespace meshtrain
