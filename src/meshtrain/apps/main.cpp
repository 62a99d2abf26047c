// src/meshtrain/apps/main.cpp — the `meshtrain` command line: prepare, tokenizer, train, sample,
// launch, reshard, export, plan.
// The only place that parses argv and turns errors into messages and exit codes:
//   0 success, 1 internal or runtime error, 2 bad configuration or arguments, 3 bad data file.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/apps/commands.h"
#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/stop_signal.h"

namespace meshtrain {
namespace {

struct TokenizerCommands {
  CLI::App* train;
  CLI::App* encode;
  CLI::App* decode;
};

// One function per command: its subcommand and options, bound to that command's arguments.
CLI::App* add_prepare_command(CLI::App& app, PrepareArgs& prepare) {
  CLI::App* prepare_cmd =
      app.add_subcommand("prepare", "text files → train.bin/val.bin/meta.json (streaming)");
  prepare_cmd->add_option("text", prepare.texts, "input text files (each one a document)")
      ->required();
  prepare_cmd->add_option("--out", prepare.out_dir, "output directory")
      ->default_val("data/prepared/shakespeare_char");
  prepare_cmd
      ->add_option("--tokenizer", prepare.tokenizer,
                   "char, gpt2, a directory with encoder.json + vocab.bpe, or a "
                   "SentencePiece .model")
      ->default_val("char");
  prepare_cmd
      ->add_option("--val-fraction", prepare.val_fraction,
                   "last share of the text that becomes val.bin")
      ->default_val(0.1);
  prepare_cmd->add_option("--document-separator", prepare.document_separator,
                          "also split documents at this literal text, e.g. \"<|endoftext|>\"");
  prepare_cmd->add_flag("--quiet", prepare.quiet, "no progress lines on stderr");
  return prepare_cmd;
}

// `tokenizer train|encode|decode`.
TokenizerCommands add_tokenizer_commands(CLI::App& app, TokenizerArgs& tok) {
  CLI::App* tokenizer_cmd = app.add_subcommand("tokenizer", "train or try a tokenizer");
  tokenizer_cmd->require_subcommand(1);
  CLI::App* tok_train =
      tokenizer_cmd->add_subcommand("train", "train a SentencePiece model → DIR/tokenizer.model");
  tok_train->add_option("--input", tok.inputs, "training text files")->required();
  tok_train->add_option("--model-type", tok.model_type, "bpe or unigram")->default_val("bpe");
  tok_train->add_option("--vocab-size", tok.vocab_size, "number of pieces")->required();
  tok_train
      ->add_option("--character-coverage", tok.character_coverage,
                   "share of characters kept (1.0; 0.9995 for CJK)")
      ->default_val(1.0);
  tok_train->add_option("--out", tok.out_dir, "output directory")->required();
  CLI::App* tok_encode = tokenizer_cmd->add_subcommand("encode", "print the ids of a text");
  CLI::App* tok_decode = tokenizer_cmd->add_subcommand("decode", "print the text of ids");
  for (CLI::App* cmd : {tok_encode, tok_decode}) {
    cmd->add_option("--tokenizer", tok.tokenizer, "gpt2, a GPT-2 directory or a .model")
        ->default_val("gpt2");
  }
  tok_encode->add_option("text", tok.text, "the text")->required();
  tok_decode->add_option("ids", tok.text, "ids separated by spaces")->required();
  return {tok_train, tok_encode, tok_decode};
}

CLI::App* add_train_command(CLI::App& app, TrainArgs& train) {
  CLI::App* train_cmd = app.add_subcommand(
      "train", "train from a TOML config; any key overridable as --section.key value");
  train_cmd->add_option("config", train.config, "TOML config file")->required();
  train_cmd->add_option("--metrics", train.metrics, "write JSON lines of per-step metrics");
  train_cmd->add_option("--trace", train.trace,
                        "write a Chrome-trace JSON of every rank's steps: phases, blocks and every "
                        "collective and send/recv with its group, bytes and wait (open it in "
                        "Perfetto; docs/tracing.md)");
  train_cmd->add_option("--tensorboard", train.tensorboard,
                        "write every per-step metric and the resolved config as a TensorBoard "
                        "event file in this directory (tensorboard --logdir DIR)");
  train_cmd
      ->add_option("--trace-steps", train.trace_steps, "steps --trace records (the first ones)")
      ->default_val(10)
      ->check(CLI::Range(1, 1000000));
  train_cmd->allow_extras();
  train_cmd->footer(
      "Every setting of the config can be overridden after it as --section.key value (or\n"
      "--section.key=value), e.g. --training.max_steps 500 --parallel.dp 2. The keys are listed\n"
      "in docs/configuration.md. Launch several ranks with mpirun -np N meshtrain train "
      "...");
  return train_cmd;
}

CLI::App* add_sample_command(CLI::App& app, SampleArgs& sample) {
  CLI::App* sample_cmd = app.add_subcommand("sample", "generate text from a checkpoint");
  sample_cmd->add_option("checkpoint", sample.checkpoint, "checkpoint directory")->required();
  sample.prompt = "\n";
  sample_cmd->add_option("--prompt", sample.prompt, "text to continue (default: a newline)");
  sample_cmd->add_option("--tokens", sample.tokens, "tokens to generate")->default_val(200);
  sample_cmd->add_option("--temperature", sample.temperature, "softmax temperature (> 0)")
      ->default_val(0.8);
  sample_cmd->add_option("--top-k", sample.top_k, "sample from the k most likely (0 = all)")
      ->default_val(200);
  sample_cmd->add_option("--seed", sample.seed, "sampling seed")->default_val(1337);
  return sample_cmd;
}

CLI::App* add_launch_command(CLI::App& app, LaunchArgs& launch) {
  CLI::App* launch_cmd = app.add_subcommand(
      "launch", "run `train` under mpirun; restart it from the newest checkpoint when a rank dies");
  launch_cmd->add_option("-n", launch.ranks, "number of ranks (mpirun -np)")->required();
  launch_cmd->add_option("--max-restarts", launch.max_restarts, "restarts after failures")
      ->default_val(3);
  launch_cmd
      ->add_option("--grace", launch.grace_s,
                   "seconds mpirun may take to exit after a rank failed; then its process "
                   "group is killed")
      ->default_val(15);
  launch_cmd
      ->add_option("--restart-delay", launch.restart_delay_s,
                   "seconds before the first restart, doubled each restart up to 60")
      ->default_val(1);
  launch_cmd->add_option("--mpirun", launch.mpirun, "mpirun to use: a path or a name on PATH")
      ->default_val("mpirun");
  launch_cmd->add_option("--mpirun-args", launch.mpirun_args,
                         "extra mpirun arguments in one string, e.g. \"--bind-to none\"");
  launch_cmd->allow_extras();  // a command without `--` is reported by run_launch
  launch_cmd->footer(
      "Usage: meshtrain launch -n N [--max-restarts K] -- train <config> [--section.key value "
      "...]\n"
      "Runs mpirun -np N <this meshtrain> train ... (adding --oversubscribe --bind-to none when N "
      "exceeds\nthe cores). When the job fails (a rank dies, a peer times out), every process of "
      "it is ended\nand it starts again with --checkpoint.resume auto, up to K times. Exit codes "
      "2 (configuration)\nand 3 (data) are not retried. See docs/resilience.md, \"Launcher\".");
  return launch_cmd;
}

CLI::App* add_reshard_command(CLI::App& app, ReshardArgs& reshard) {
  CLI::App* reshard_cmd = app.add_subcommand(
      "reshard", "rewrite a sharded checkpoint for another layout (offline, no MPI)");
  reshard_cmd->add_option("checkpoint", reshard.checkpoint, "complete checkpoint directory")
      ->required();
  reshard_cmd
      ->add_option("out", reshard.out_root,
                   "checkpoints folder to write step-N into (e.g. runs/x/checkpoints)")
      ->required();
  reshard_cmd->allow_extras();
  reshard_cmd->footer(
      "The target layout is the checkpoint's config with the overrides that follow, e.g.\n"
      "  meshtrain reshard runs/a/checkpoints/step-00000500 runs/b/checkpoints --parallel.tp 2 "
      "--parallel.dp 1\nA run with --checkpoint.dir runs/b --checkpoint.resume auto then "
      "continues from it.");
  return reshard_cmd;
}

CLI::App* add_export_command(CLI::App& app, ExportArgs& export_args) {
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "checkpoint → one consolidated safetensors file with Hugging Face names and layouts "
      "(GPT2LMHeadModel / LlamaForCausalLM / MixtralForCausalLM), plus config.json and the "
      "run's tokenizer files beside it");
  export_cmd->add_option("checkpoint", export_args.checkpoint, "checkpoint directory")->required();
  export_cmd->add_option("out", export_args.out, "output file, e.g. hf/model.safetensors")
      ->required();
  return export_cmd;
}

CLI::App* add_plan_command(CLI::App& app, PlanArgs& plan_args) {
  CLI::App* plan_cmd = app.add_subcommand(
      "plan",
      "memory, communication, bubble and step time of a model on a cluster; searches "
      "layouts (no MPI)");
  plan_cmd
      ->add_option("--model", plan_args.model,
                   "preset (gpt3-175b, llama3-8b|70b|405b, llama-33b, mixtral-8x7b) or a "
                   "meshtrain TOML config (configs/*.toml)")
      ->required();
  plan_cmd
      ->add_option("--cluster", plan_args.cluster,
                   "preset (8xA100-80GB, 8xH100-80GB, 8xH200, cpu-this-machine) or a "
                   "cluster TOML file")
      ->required();
  plan_cmd->add_option("--nodes", plan_args.nodes, "nodes (default: the cluster's)");
  plan_cmd->add_option("--seq", plan_args.seq, "sequence length (default: the model's)");
  plan_cmd->add_option("--global-batch", plan_args.global_batch, "sequences per step");
  plan_cmd->add_option("--precision", plan_args.precision, "fp32, bf16 or fp16")
      ->default_val("bf16");
  plan_cmd->add_option("--layout", plan_args.layout,
                       "one layout instead of a search, e.g. tp=8,pp=4,dp=2,zero=1,mb=1,"
                       "recompute=selective,sp=true,v=1,schedule=1f1b");
  plan_cmd->add_option("--efficiency", plan_args.efficiency,
                       "achieved/peak FLOP/s assumed for compute (default: the cluster's)");
  plan_cmd
      ->add_option("--dp-overlap", plan_args.dp_overlap,
                   "fraction of the dp communication hidden behind compute")
      ->default_val(0.0);
  plan_cmd
      ->add_option("--memory-fraction", plan_args.memory_fraction,
                   "fraction of device memory a layout may use")
      ->default_val(0.9);
  plan_cmd
      ->add_option("--max-micro-batch", plan_args.max_micro_batch, "largest micro-batch searched")
      ->default_val(64);
  plan_cmd
      ->add_option("--cp", plan_args.cp,
                   "context-parallel size the search uses: a number, or auto (every divisor)")
      ->default_val("1");
  plan_cmd
      ->add_option("--cp-comm", plan_args.cp_comm,
                   "context-parallel attention: p2p (ring), a2a (Ulysses) or auto (both)")
      ->default_val("auto");
  plan_cmd->add_flag("--explain", plan_args.explain, "print every term with its formula");
  plan_cmd->add_flag("--placements", plan_args.placements,
                     "with --layout: print where every tensor lives (per mesh axis, local "
                     "shape, gradient reduction, ZeRO slice)");
  plan_cmd->add_flag("--json", plan_args.json, "print JSON instead of the table");
  plan_cmd->add_flag("--emit", plan_args.emit,
                     "print only the chosen layout as `meshtrain train` flags");
  plan_cmd->add_flag("--emit-sbatch", plan_args.emit_sbatch,
                     "print only a Slurm batch script that trains the chosen layout");
  plan_cmd->add_option("--top", plan_args.top, "rows of the table")->default_val(10);
  plan_cmd->add_option("--claim-samples-per-s", plan_args.claim_samples_per_s,
                       "a claimed throughput (sequences/s) to check: the MFU it implies");
  plan_cmd->add_option("--claim-tokens-per-s", plan_args.claim_tokens_per_s,
                       "a claimed throughput (tokens/s) to check: the MFU it implies");
  return plan_cmd;
}

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  using namespace meshtrain;
  CLI::App app{"meshtrain: train GPT-style language models over MPI ranks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshtrain " MESHTRAIN_VERSION);

  PrepareArgs prepare;
  CLI::App* prepare_cmd = add_prepare_command(app, prepare);
  TokenizerArgs tok;
  const TokenizerCommands tokenizer_cmds = add_tokenizer_commands(app, tok);
  TrainArgs train;
  CLI::App* train_cmd = add_train_command(app, train);
  SampleArgs sample;
  CLI::App* sample_cmd = add_sample_command(app, sample);
  LaunchArgs launch;
  CLI::App* launch_cmd = add_launch_command(app, launch);
  ReshardArgs reshard;
  CLI::App* reshard_cmd = add_reshard_command(app, reshard);
  ExportArgs export_args;
  CLI::App* export_cmd = add_export_command(app, export_args);
  PlanArgs plan_args;
  CLI::App* plan_cmd = add_plan_command(app, plan_args);

  if (argc > 1 && argv[1][0] != '-') {
    const std::string_view command = argv[1];
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
    }
    if (std::find(names.begin(), names.end(), command) == names.end()) {
      fmt::print(stderr,
                 "meshtrain: unknown command '{}'; the commands are {} (meshtrain --help)\n",
                 command, fmt::join(names, ", "));
      return 2;
    }
  }
  // launch: what follows `--` is the job's command, passed on untouched; CLI11 sees only the
  // launcher's own options.
  int parsed_argc = argc;
  if (argc > 1 && std::string_view(argv[1]) == "launch") {
    for (int i = 2; i < argc; ++i) {
      if (std::string_view(argv[i]) == "--") {
        parsed_argc = i;
        launch.separator = true;
        launch.command.assign(argv + i + 1, argv + argc);
        break;
      }
    }
  }
  try {
    app.parse(parsed_argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (*prepare_cmd) return run_prepare(prepare);
  if (*tokenizer_cmds.train) return run_tokenizer_train(tok);
  if (*tokenizer_cmds.encode) return run_tokenizer_encode(tok);
  if (*tokenizer_cmds.decode) return run_tokenizer_decode(tok);
  if (*reshard_cmd) {
    reshard.overrides = reshard_cmd->remaining();
    return run_reshard(reshard);
  }
  if (*sample_cmd) return run_sample(sample);
  if (*launch_cmd) {
    launch.unexpected = launch_cmd->remaining();  // words before `--` that are no option
    return run_launch(launch);
  }
  if (*export_cmd) return run_export(export_args);
  if (*plan_cmd) return run_plan(plan_args);
  train.overrides = train_cmd->remaining();
  // Before MPI starts its threads, so that they (and OpenMP's, and the watchdog's) inherit the
  // stop signals blocked, and a signal that arrives during start-up is kept for the first step
  // boundary rather than killing the rank (core/stop_signal.h).
  install_stop_signal_handlers();
  MpiRuntime runtime(&argc, &argv);
  return run_train(train, runtime);
}
