// src/meshtrain/apps/export_command.cpp — `meshtrain export <checkpoint> <out.safetensors>`:
// a run's logical tensors → one Hugging Face file (checkpoint/hf_format.h) + config.json, and
// the run's tokenizer files for AutoTokenizer (checkpoint/hf_tokenizer.h) beside them. One
// process, no MPI. Everything is read and checked before the first file is written.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/checkpoint/hf_tokenizer.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// The tokenizer kind recorded in the checkpoint's meta.json ("" when it has none: a sharded
// checkpoints/step-N directory, or a run from before meta.json recorded it). Reads only the
// two fields of the format docs/tokenizers.md defines: "format" and "tokenizer"."kind".
// TODO(issue 15, tok): use data::load_metadata once the v2 reader is on main.
std::string tokenizer_kind(const fs::path& checkpoint) {
  const fs::path meta = checkpoint / "meta.json";
  std::error_code ec;
  if (!fs::exists(meta, ec)) return "";
  std::ifstream in(meta);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const auto field = [&](const nlohmann::json& o, const char* key) {
    return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : "";
  };
  const std::string format = field(j, "format");
  if (format == "meshtrain-char-v1") return "char";
  if (format == "meshtrain-tokens-v2" && j.contains("tokenizer")) {
    if (std::string kind = field(j["tokenizer"], "kind"); !kind.empty()) return kind;
  }
  throw DataError(fmt::format(
      "{}: not a meshtrain meta.json (format \"meshtrain-tokens-v2\" with a tokenizer kind, or "
      "\"meshtrain-char-v1\")",
      meta.string()));
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
