// src/meshtrain/apps/commands.h — one function per subcommand; each returns the exit code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain {

class MpiRuntime;

struct PrepareArgs {
  std::vector<std::string> texts;  // input text files, each a document
  std::string out_dir;
  std::string tokenizer = "char";  // char | gpt2 | a GPT-2 directory | a SentencePiece .model
  double val_fraction = 0.1;
  std::string document_separator;  // --document-separator: also split documents at this text
  bool quiet = false;              // no progress lines on stderr
};
int run_prepare(const PrepareArgs& args);

struct TokenizerArgs {
  // train
  std::vector<std::string> inputs;
  std::string model_type = "bpe";
  std::int64_t vocab_size = 0;
  double character_coverage = 1.0;
  std::string out_dir;
  // encode / decode
  std::string tokenizer = "gpt2";
  std::string text;  // encode: the text; decode: space-separated ids
};
int run_tokenizer_train(const TokenizerArgs& args);
int run_tokenizer_encode(const TokenizerArgs& args);
int run_tokenizer_decode(const TokenizerArgs& args);

struct TrainArgs {
  std::string config;
  std::string metrics;
  std::string trace;
  std::string tensorboard;
  int trace_steps = 10;
  std::vector<std::string> overrides;  // --section.key value ...
};
int run_train(const TrainArgs& args, const MpiRuntime& runtime);

struct SampleArgs {
  std::string checkpoint;
  std::string prompt;
  std::int64_t tokens = 200;
  double temperature = 0.8;
  std::int64_t top_k = 200;
  std::int64_t seed = 1337;
};
int run_sample(const SampleArgs& args);

struct LaunchArgs {
  int ranks = 0;                        // -n
  int max_restarts = 3;                 // --max-restarts
  double grace_s = 15;                  // --grace: after a rank failed, before mpirun is ended
  double restart_delay_s = 1;           // --restart-delay: first wait between attempts, doubling
  std::string mpirun = "mpirun";        // --mpirun: a path, or a name looked up on PATH
  std::string mpirun_args;              // --mpirun-args: extra mpirun arguments, one string
  bool separator = false;               // `--` was given
  std::vector<std::string> unexpected;  // words before `--` that are no launcher option
  std::vector<std::string> command;     // after `--`: train <config> [overrides...]
};
// Runs the job under mpirun and restarts it from the newest complete checkpoint when it fails.
// Does not initialise MPI.
int run_launch(const LaunchArgs& args);

struct ReshardArgs {
  std::string checkpoint;              // a complete checkpoint directory
  std::string out_root;                // where step-N is written
  std::vector<std::string> overrides;  // --section.key value ... on the checkpoint's config
};
// Writes the checkpoint re-cut for the layout the overrides describe. Does not initialise MPI.
int run_reshard(const ReshardArgs& args);

struct ExportArgs {
  std::string checkpoint;  // a finished run's checkpoint directory
  std::string out;         // the consolidated .safetensors to write (config.json beside it)
};
int run_export(const ExportArgs& args);

struct PlanArgs {
  std::string model;    // preset name or configs/*.toml
  std::string cluster;  // preset name or cluster .toml
  // Not given (nullopt), not a sentinel value: every value given is checked.
  std::optional<std::int64_t> nodes;         // nullopt: the cluster's own node count
  std::optional<std::int64_t> seq;           // nullopt: the model's sequence length
  std::optional<std::int64_t> global_batch;  // sequences per step; nullopt: the devices
  std::string precision = "bf16";
  std::string layout;                // empty: search
  std::optional<double> efficiency;  // nullopt: the cluster's default
  double dp_overlap = 0.0;
  double memory_fraction = 0.9;
  std::int64_t max_micro_batch = 64;
  std::string cp = "1";  // context-parallel sizes searched: a number, or "auto" (every divisor)
  std::string cp_comm = "auto";  // with cp > 1: "p2p", "a2a", or "auto" (both searched)
  bool explain = false;
  bool placements = false;  // with --layout: print the placement table (plan/placements.h)
  bool json = false;
  bool emit = false;         // print the layout as `meshtrain train` flags only (plan/emit.h)
  bool emit_sbatch = false;  // print a Slurm batch script that trains it
  std::int64_t top = 10;     // rows of the table, ≥ 1
  // A published throughput to check against the peak (plan/claims.h); nullopt: none.
  std::optional<double> claim_samples_per_s;
  std::optional<double> claim_tokens_per_s;
};
// Plans a model on a cluster: one layout's account, or a search of all layouts. No MPI.
int run_plan(const PlanArgs& args);

}  // namespace meshtrain
