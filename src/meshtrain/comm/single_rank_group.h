// src/meshtrain/comm/single_rank_group.h — a group of one rank that needs no MPI: every
// operation of a one-rank ProcessGroup returns before reaching the backend, so this is what
// `meshtrain sample` and single-process tests build a model over (tp = 1, the plain layers).
#pragma once

#include <memory>
#include <string>

#include "meshtrain/comm/process_group.h"

namespace meshtrain {

/// Rank 0 of 1, named `axis_name`{0}. split() returns another such group.
std::unique_ptr<ProcessGroup> single_rank_group(std::string axis_name = "self");

/// Rank `rank` of `size` with no backend: it has a rank and a size, so a model can be built
/// over it to learn a layout's shards without running the layout (meshtrain reshard builds
/// every target rank's shards in one process this way). Any operation of a group of more than
/// one rank aborts through MT_CHECK. MT_CHECKs 0 ≤ rank < size.
std::unique_ptr<ProcessGroup> detached_group(int rank, int size, std::string axis_name);

}  // namespace meshtrain
