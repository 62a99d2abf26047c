// src/meshtrain/apps/export_command.cpp — `meshtrain export <checkpoint> <out.safetensors>`:
// a run's logical tensors → one Hugging Face file (checkpoint/hf_format.h). One process, no MPI.
#include <fmt/format.h>

#include <filesystem>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

int run_export(const ExportArgs& args) {
  namespace fs = std::filesystem;
  return run_with_exit_codes("export", [&] {
    const fs::path out = args.out;
    const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      throw ConfigError(
          "the command line",
          {{"out", args.out, fmt::format("its directory {} does not exist", dir.string()),
            fmt::format("create it first (mkdir -p {}) or choose another path", dir.string())}});
    }
    if (fs::is_directory(out, ec)) {
      throw ConfigError("the command line",
                        {{"out", args.out, "is a directory",
                          "name the file, e.g. " + (out / "model.safetensors").string()}});
    }
    const LogicalModel model = load_logical_model(args.checkpoint);
    try {
      export_hf(model.tensors, model.config, out);
    } catch (const DataError& e) {
      throw DataError(fmt::format("{}: {}", args.checkpoint, e.what()));
    }
    std::int64_t elements = 0;
    for (const NamedTensor& t : model.tensors) elements += t.tensor.numel();
    fmt::print("exported {} ({}, {} parameters in {} tensors) to {} and {}\n", args.checkpoint,
               to_string(model.config.model.family), elements, model.tensors.size(), out.string(),
               (dir / "config.json").string());
    return 0;
  });
}

}  // namespace meshtrain
