// src/meshtrain/layers/placement.h
//
// The process groups of this rank that the placement table's axes name (mesh/placement.h:
// which copy counts, ParamPlacement::counts_copy; which group reduces, ReplicaGroup).
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

}  // namespace meshtrain
