// src/meshtrain/apps/export_command.cpp — `meshtrain export <checkpoint> <out.safetensors>`:
// a run's logical tensors → one Hugging Face file (checkpoint/hf_format.h) + config.json, and
// the run's tokenizer files for AutoTokenizer (checkpoint/hf_tokenizer.h) beside them. One
// process, no MPI. Everything is read and checked before the first file is written.
#include <fmt/format.h>

#include <filesystem>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/checkpoint/hf_tokenizer.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// The tokenizer kind recorded in the checkpoint's meta.json (docs/tokenizers.md; data::
// load_metadata validates it, a bad one is a DataError naming the file), "" when the checkpoint
// has none (a sharded checkpoints/step-N directory, or a run on foreign token files).
std::string tokenizer_kind(const fs::path& checkpoint) {
  const fs::path meta = checkpoint / data::kMetaJsonName;
  std::error_code ec;
  if (!fs::exists(meta, ec)) return "";
  return std::string(data::tokenizer_kind_name(data::load_metadata(meta).tokenizer));
}

void check_out_path(const ExportArgs& args, const fs::path& dir) {
  const fs::path out = args.out;
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
}

}  // namespace

int run_export(const ExportArgs& args) {
  return run_with_exit_codes("export", [&] {
    const fs::path out = args.out;
    const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
    check_out_path(args, dir);
    const LogicalModel model = load_logical_model(args.checkpoint);
    const std::string kind = tokenizer_kind(args.checkpoint);
    const HfTokenizerFiles tokenizer =
        kind.empty() ? HfTokenizerFiles{.files = {},
                                        .note =
                                            "no tokenizer files: the checkpoint has no "
                                            "meta.json (export the run's final checkpoint "
                                            "for them)"}
                     : read_hf_tokenizer(kind, args.checkpoint, model.config.model.vocab_size,
                                         model.config.model.block_size);
    try {
      export_hf(model.tensors, model.config, out);
      write_hf_tokenizer(tokenizer, dir);
    } catch (const DataError& e) {
      throw DataError(fmt::format("{}: {}", args.checkpoint, e.what()));
    }
    std::int64_t elements = 0;
    for (const NamedTensor& t : model.tensors) elements += t.tensor.numel();
    std::string tokenizer_files;
    for (const HfTokenizerFiles::File& f : tokenizer.files) tokenizer_files += ", " + f.name;
    fmt::print("exported {} ({}, {} parameters in {} tensors) to {} and {}{}; {}\n",
               args.checkpoint, to_string(model.config.model.family), elements,
               model.tensors.size(), out.string(), (dir / "config.json").string(), tokenizer_files,
               tokenizer.note);
    return 0;
  });
}

}  // namespace meshtrain
