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

}  // namespace meshtrain
