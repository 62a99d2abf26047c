// src/meshtrain/layers/placement.h
//
// The process groups of this rank that the placement table's axes name (mesh/placement.h:
// which copy counts, ParamPlacement::counts_copy; which group reduces, ReplicaGroup), and the
// one place that says which ranks reduce a parameter's gradient.
#pragma once

#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/parameter.h"
#include "meshtrain/mesh/placement.h"

namespace meshtrain {

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

/// The ranks that hold the same parameters and see different tokens: gradients are reduced
/// and ZeRO shards over them, the grad norm of a sharded optimizer state sums over them, and
/// losses are averaged over them. The one place that names this group.
ProcessGroup& grad_reduction_group(const DeviceMesh& mesh);

/// The ranks a parameter of replica group `g` is reduced and ZeRO-sliced over: the
/// grad_reduction_group for dense weights, the expert-data-parallel group for experts'.
ProcessGroup& replica_group(const DeviceMesh& mesh, ReplicaGroup g);

/// This rank's groups for placements.
PlacementGroups placement_groups(const DeviceMesh& mesh);

}  // namespace meshtrain
