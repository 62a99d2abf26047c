// src/meshtrain/plan/placements.h
//
// `meshtrain plan --placements`: the placement table (mesh/placement.h) of a layout as text,
// one row per tensor, so a user sees where every tensor of a run lives before booking a
// cluster. No tensors are made: the table is a pure function of the model and the layout.
#pragma once

#include <string>

#include "meshtrain/mesh/placement.h"

namespace meshtrain::plan {

/// One row per record: name, global shape, the placement on each mesh axis (pp, dp, cp, tp,
/// ep), the local shape on the first rank that holds it, the axes its gradient is summed over
/// and its ZeRO slice (elements per replica; "-" without ZeRO), then per pipeline stage the
/// tensors and elements (padding included) one rank of it holds. `title` heads the table.
std::string format_placements(const PlacementTable& table, const std::string& title);

}  // namespace meshtrain::plan
