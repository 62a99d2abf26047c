#include "meshtrain/layers/placement.h"

namespace meshtrain {

// Every rank that holds a replica of the parameters: dp × cp (context parallel splits
// sequences, not weights); the dp group itself when cp = 1.
ProcessGroup& grad_reduction_group(const DeviceMesh& mesh) { return mesh.dp_cp_group(); }

ProcessGroup& replica_group(const DeviceMesh& mesh, ReplicaGroup g) {
  return g == ReplicaGroup::expert ? mesh.expert_dp_group() : grad_reduction_group(mesh);
}

PlacementGroups placement_groups(const DeviceMesh& mesh) {
  return {.tp = mesh.group(Axis::tp),
          .pp = mesh.group(Axis::pp),
          .dense = replica_group(mesh, ReplicaGroup::dense),
          .expert = replica_group(mesh, ReplicaGroup::expert)};
}

}  // namespace meshtrain
