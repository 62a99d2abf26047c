// src/meshtrain/plan/emit.h
//
// `meshtrain plan --emit` / `--emit-sbatch` (docs/planner.md, "From a plan to a run"): a
// planned layout written as the `meshtrain train` command-line overrides that run it, and as a
// Slurm batch script for the cluster's nodes (docs/multinode.md). The flags use the config
// keys exactly as config/load.cpp accepts them and the enum names of config/config.h's name
// tables, so that loading a config with these overrides gives the planned layout back
// (tests/unit/plan/plan_emit_test.cpp). Uses: config, plan/cluster.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain::plan {

/// The overrides, as separate argv words ("--parallel.tp", "2", ...), that set every layout
/// field of `planned` (a plan's Config, layout.h's to_config): parallel.tp/pp/dp/cp/ep,
/// cp_comm, virtual_stages, pp_schedule, zero_stage, sequence_parallel; training.micro_batch,
/// accumulation, global_batch, recompute, precision; and model.block_size when the plan's
/// sequence length differs from `model`'s (plan --seq). All of them always, in this order,
/// so that the layout does not depend on the defaults or the config file it is added to.
std::vector<std::string> train_flags(const Config& planned, const ModelConfig& model);

/// `words` joined by blanks, each quoted for a POSIX shell when it holds anything outside
/// [A-Za-z0-9_./:=,+-] (the flags above never do; a config path may).
std::string shell_join(const std::vector<std::string>& words);

/// What the batch script needs besides the flags.
struct SbatchSettings {
  std::int64_t nodes = 1;              // #SBATCH --nodes
  std::int64_t ranks_per_node = 1;     // #SBATCH --ntasks-per-node (devices per node)
  std::string config = "CONFIG.toml";  // the `meshtrain train` config file
  std::string layout;                  // the layout's short form, for the script's comment
};

/// A Slurm batch script (bash) that runs `meshtrain train <config> <flags> <the script's own
/// arguments>` on nodes × ranks_per_node ranks with `srun --mpi=pmix`, the OpenMPI-mpirun
/// alternative commented, in the form of scripts/slurm/train.sbatch. Lines end in '\n'.
std::string sbatch_script(const std::vector<std::string>& flags, const SbatchSettings& settings);

}  // namespace meshtrain::plan
