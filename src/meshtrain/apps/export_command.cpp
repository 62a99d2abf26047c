// src/meshtrain/apps/export_command.cpp — `meshtrain export <checkpoint> <out.safetensors>`:
// a run's logical tensors → one Hugging Face file (checkpoint/hf_format.h) + config.json, and
// the run's tokenizer files for AutoTokenizer (checkpoint/hf_tokenizer.h) beside them. One
// process, no MPI. Everything is read and checked before the first file is written.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <optional>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/checkpoint/hf_tokenizer.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/sentencepiece_tokenizer.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// The checkpoint's meta.json (docs/tokenizers.md; data::load_metadata validates it, a bad one
// is a DataError naming the file), none when the checkpoint has none (a sharded
// checkpoints/step-N directory, or a run on foreign token files).
std::optional<data::Metadata> checkpoint_metadata(const fs::path& checkpoint) {
  const fs::path meta_json = checkpoint / data::kMetaJsonName;
  std::error_code ec;
  if (!fs::exists(meta_json, ec)) return std::nullopt;
  return data::load_metadata(meta_json);
}

// The special ids config.json names, from the tokenizer itself (data::load_tokenizer checks
// its files against meta.json: a mismatch is a DataError naming the file): GPT-2's
// <|endoftext|> is bos and eos (as Hugging Face's gpt2 config), SentencePiece has its own bos
// and eos pieces, char has neither.
HfTokenIds special_ids(const std::optional<data::Metadata>& meta, const fs::path& checkpoint) {
  if (!meta || meta->tokenizer == data::TokenizerKind::char_bytes) return {};
  const std::unique_ptr<data::Tokenizer> tokenizer = data::load_tokenizer(*meta, checkpoint);
  HfTokenIds ids{.bos = tokenizer->eot_id(), .eos = tokenizer->eot_id()};
  if (const auto* sp = dynamic_cast<const data::SentencePieceTokenizer*>(tokenizer.get())) {
    ids.bos = sp->bos_id();
  }
  return ids;
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
    const std::optional<data::Metadata> meta = checkpoint_metadata(args.checkpoint);
    const HfTokenizerFiles tokenizer =
        !meta ? HfTokenizerFiles{.files = {},
                                 .note =
                                     "no tokenizer files: the checkpoint has no "
                                     "meta.json (export the run's final checkpoint "
                                     "for them)"}
              : read_hf_tokenizer(data::tokenizer_kind_name(meta->tokenizer), args.checkpoint,
                                  model.config.model.vocab_size, model.config.model.block_size);
    const HfTokenIds ids = special_ids(meta, args.checkpoint);
    std::vector<std::string> removed;
    try {
      export_hf(model.tensors, model.config, out, ids);
      removed = write_hf_tokenizer(tokenizer, dir);
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
    if (!removed.empty()) {
      fmt::print("removed {} from {}: an earlier export's tokenizer files, not this model's\n",
                 fmt::join(removed, ", "), dir.string());
    }
    return 0;
  });
}

}  // namespace meshtrain
