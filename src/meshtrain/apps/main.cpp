// src/meshtrain/apps/main.cpp — the `meshtrain` command line: prepare, train, sample, export.
// The only place that parses argv and turns errors into messages and exit codes:
//   0 success, 1 internal or runtime error, 2 bad configuration or arguments, 3 bad data file.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/apps/commands.h"
#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/core/error.h"

int main(int argc, char** argv) {
  using namespace meshtrain;
  CLI::App app{"meshtrain: train GPT-style language models over MPI ranks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshtrain " MESHTRAIN_VERSION);

  PrepareArgs prepare;
  CLI::App* prepare_cmd =
      app.add_subcommand("prepare", "text file → train.bin/val.bin/meta.json (character level)");
  prepare_cmd->add_option("text", prepare.text, "input text file")->required();
  prepare_cmd->add_option("--out", prepare.out_dir, "output directory")
      ->default_val("data/prepared/shakespeare_char");

  TrainArgs train;
  CLI::App* train_cmd = app.add_subcommand(
      "train", "train from a TOML config; any key overridable as --section.key value");
  train_cmd->add_option("config", train.config, "TOML config file")->required();
  train_cmd->add_option("--metrics", train.metrics, "write JSON lines of per-step metrics");
  train_cmd->add_option("--trace", train.trace,
                        "write the first 10 steps' pipeline actions of every rank as Chrome-trace "
                        "JSON (open it in Perfetto)");
  train_cmd->allow_extras();
  train_cmd->footer(
      "Every setting of the config can be overridden after it as --section.key value (or\n"
      "--section.key=value), e.g. --training.max_steps 500 --parallel.dp 2. The keys are listed\n"
      "in README.md, \"Configuration\". Launch several ranks with mpirun -np N meshtrain train "
      "...");

  SampleArgs sample;
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

  ExportArgs export_args;
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "checkpoint → one consolidated safetensors file with Hugging Face names and layouts "
      "(GPT2LMHeadModel / LlamaForCausalLM), plus config.json beside it");
  export_cmd->add_option("checkpoint", export_args.checkpoint, "checkpoint directory")->required();
  export_cmd->add_option("out", export_args.out, "output file, e.g. hf/model.safetensors")
      ->required();

  if (argc > 1 && argv[1][0] != '-') {
    const std::string_view command = argv[1];
    if (command != "prepare" && command != "train" && command != "sample" && command != "export") {
      fmt::print(stderr,
                 "meshtrain: unknown command '{}'; the commands are prepare, train, sample and "
                 "export (meshtrain --help)\n",
                 command);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (*prepare_cmd) return run_prepare(prepare);
  if (*sample_cmd) return run_sample(sample);
  if (*export_cmd) return run_export(export_args);
  train.overrides = train_cmd->remaining();
  MpiRuntime runtime(&argc, &argv);
  return run_train(train, runtime);
}
