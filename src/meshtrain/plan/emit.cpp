#include "meshtrain/plan/emit.h"

#include <fmt/format.h>

#include <algorithm>

namespace meshtrain::plan {
namespace {

// One word safe in a POSIX shell without quotes.
bool shell_safe(const std::string& word) {
  return !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_./:=,+-").find(c) != std::string_view::npos;
  });
}

// Single quotes keep everything literal; a quote inside is closed, escaped and reopened.
std::string shell_quote(const std::string& word) {
  if (shell_safe(word)) return word;
  std::string out = "'";
  for (const char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::vector<std::string> train_flags(const Config& planned, const ModelConfig& model) {
  const ParallelConfig& p = planned.parallel;
  const TrainingConfig& t = planned.training;
  std::vector<std::string> out;
  const auto add = [&out](const char* key, std::string value) {
    out.push_back(fmt::format("--{}", key));
    out.push_back(std::move(value));
  };
  add("parallel.tp", fmt::format("{}", p.tp));
  add("parallel.pp", fmt::format("{}", p.pp));
  add("parallel.dp", fmt::format("{}", p.dp));
  add("parallel.cp", fmt::format("{}", p.cp));
  add("parallel.cp_comm", std::string(to_string(p.cp_comm)));
  add("parallel.ep", fmt::format("{}", p.ep));
  add("parallel.pp_schedule", std::string(to_string(p.pp_schedule)));
  add("parallel.virtual_stages", fmt::format("{}", p.virtual_stages));
  add("parallel.zero_stage", fmt::format("{}", p.zero_stage));
  add("parallel.sequence_parallel", p.sequence_parallel ? "true" : "false");
  add("training.micro_batch", fmt::format("{}", t.micro_batch));
  add("training.accumulation", fmt::format("{}", t.accumulation));
  add("training.global_batch", fmt::format("{}", t.global_batch));
  add("training.recompute", std::string(to_string(t.recompute)));
  add("training.precision", std::string(to_string(t.precision)));
  if (planned.model.block_size != model.block_size) {
    add("model.block_size", fmt::format("{}", planned.model.block_size));
  }
  return out;
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + shell_quote(w);
  return out;
}

std::string sbatch_script(const std::vector<std::string>& flags, const SbatchSettings& s) {
  // The form of scripts/slurm/train.sbatch (docs/multinode.md, "Slurm"), with the plan's
  // allocation and flags written in.
  return fmt::format(
      R"(#!/bin/bash
# meshtrain on Slurm, written by `meshtrain plan --emit-sbatch` for the layout
#   {layout}
# on {nodes} node(s) x {per_node} rank(s) per node. Submit with `sbatch <this file>`; arguments
# after its name are added to `meshtrain train`'s (sbatch <this file> --checkpoint.dir runs/x).
# Data and checkpoint directories must be on a filesystem every node sees (docs/multinode.md).
#SBATCH --job-name=meshtrain
#SBATCH --nodes={nodes}
# One MPI rank per device; training.threads follows the cores per rank (below).
#SBATCH --ntasks-per-node={per_node}
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --output=%x-%j.out
set -euo pipefail
MESHTRAIN=${{MESHTRAIN:-meshtrain}}
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
# srun starts the ranks through Slurm's PMIx plugin (`srun --mpi=list` must show pmix).
# Without it, OpenMPI's mpirun reads the allocation itself:
#   mpirun -np "$SLURM_NTASKS" --map-by ppr:"$SLURM_NTASKS_PER_NODE":node --bind-to none \
#     "$MESHTRAIN" train ...
srun --mpi=pmix "$MESHTRAIN" train {config} \
  {flags} \
  --training.threads "$SLURM_CPUS_PER_TASK" "$@"
)",
      fmt::arg("layout", s.layout), fmt::arg("nodes", s.nodes),
      fmt::arg("per_node", s.ranks_per_node), fmt::arg("config", shell_quote(s.config)),
      fmt::arg("flags", shell_join(flags)));
}

}  // namespace meshtrain::plan
