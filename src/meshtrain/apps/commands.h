// src/meshtrain/apps/commands.h — one function per subcommand; each returns the exit code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

class MpiRuntime;

struct PrepareArgs {
  std::string text;
  std::string out_dir;
};
int run_prepare(const PrepareArgs& args);

struct TrainArgs {
  std::string config;
  std::string metrics;
  std::string trace;
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

struct ExportArgs {
  std::string checkpoint;  // a finished run's checkpoint directory
  std::string out;         // the consolidated .safetensors to write (config.json beside it)
};
int run_export(const ExportArgs& args);

}  // namespace meshtrain
