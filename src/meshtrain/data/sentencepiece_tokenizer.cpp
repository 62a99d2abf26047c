#include "meshtrain/data/sentencepiece_tokenizer.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <unordered_map>
#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/data/tokenizer_files.h"

namespace meshtrain::data {

SentencePieceTokenizer::SentencePieceTokenizer(std::string model_proto,
                                               const std::filesystem::path& path)
    : model_proto_(std::move(model_proto)),
      processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const sentencepiece::util::Status status = processor_->LoadFromSerializedProto(model_proto_);
  if (!status.ok()) {
    throw DataError(fmt::format(
        "SentencePiece model '{}' cannot be loaded ({}); expected a complete .model file "
        "written by SentencePiece (e.g. by `meshtrain tokenizer train`), not a truncated copy",
        path.string(), status.ToString()));
  }
  vocab_size_ = processor_->GetPieceSize();
  eos_id_ = processor_->eos_id();
  if (eos_id_ < 0 || eos_id_ >= vocab_size_) {
    throw DataError(fmt::format(
        "SentencePiece model '{}' has no eos piece, which meshtrain uses as the end-of-text id "
        "between documents; train the model with eos_id ≥ 0 (SentencePiece's default is 2)",
        path.string()));
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::load(
    const std::filesystem::path& model_file) {
  return std::make_unique<SentencePieceTokenizer>(
      read_tokenizer_file(model_file, "SentencePiece model"), model_file);
}

void SentencePieceTokenizer::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  std::vector<int> ids;
  const sentencepiece::util::Status status = processor_->Encode(text, &ids);
  if (!status.ok()) {
    throw DataError(fmt::format("SentencePiece cannot encode the text: {}", status.ToString()));
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(std::span<const std::int32_t> ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      throw DataError(
          fmt::format("token id {} at position {} is outside the SentencePiece vocabulary [0, {})",
                      ids[i], i, vocab_size_));
    }
  }
  std::string text;
  const sentencepiece::util::Status status =
      processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok())
    throw DataError(fmt::format("SentencePiece cannot decode: {}", status.ToString()));
  return text;
}

void SentencePieceTokenizer::save_files(const std::filesystem::path& dir) const {
  StagedFile(dir / "tokenizer.model", std::as_bytes(std::span<const char>(model_proto_))).commit();
}

namespace {

void check_train_args(const SentencePieceTrainArgs& args) {
  std::vector<ConfigIssue> issues;
  if (args.model_type != "bpe" && args.model_type != "unigram") {
    issues.push_back({"--model-type", args.model_type, "must be bpe or unigram",
                      "use --model-type bpe (GPT/Llama style) or unigram (T5 style)"});
  }
  if (args.vocab_size < 8 || args.vocab_size > 1'000'000) {
    issues.push_back({"--vocab-size", std::to_string(args.vocab_size), "must lie in [8, 1000000]",
                      "use e.g. --vocab-size 8000"});
  }
  if (!(args.character_coverage > 0.0 && args.character_coverage <= 1.0)) {
    issues.push_back({"--character-coverage", fmt::format("{}", args.character_coverage),
                      "must lie in (0, 1]", "use 1.0 for small alphabets, 0.9995 for CJK"});
  }
  if (args.inputs.empty()) {
    issues.push_back({"--input", "(none)", "needs at least one text file",
                      "pass e.g. --input data/tinyshakespeare.txt"});
  }
  if (!issues.empty()) throw ConfigError("the command line", std::move(issues));
  for (const std::filesystem::path& input : args.inputs) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(input, ec)) {
      throw DataError(
          fmt::format("training text '{}' is not a readable file; pass plain-text "
                      "files to --input",
                      input.string()));
    }
  }
}

}  // namespace

std::filesystem::path train_sentencepiece(const SentencePieceTrainArgs& args) {
  check_train_args(args);
  std::string inputs;
  for (const std::filesystem::path& input : args.inputs) {
    inputs += (inputs.empty() ? "" : ",") + input.string();
  }
  std::error_code ec;
  std::filesystem::create_directories(args.out_dir, ec);
  if (ec || !std::filesystem::is_directory(args.out_dir)) {
    throw DataError(fmt::format("cannot create output directory '{}'; choose a writable one",
                                args.out_dir.string()));
  }
  // Trained in memory (the serialized proto comes back), written atomically by us.
  const std::unordered_map<std::string, std::string> kwargs = {
      {"input", inputs},
      {"model_type", args.model_type},
      {"vocab_size", std::to_string(args.vocab_size)},
      {"character_coverage", fmt::format("{}", args.character_coverage)},
      {"model_prefix", ""},
      {"minloglevel", "1"},
      {"num_threads", "2"},
  };
  std::string model;
  const sentencepiece::util::Status status =
      sentencepiece::SentencePieceTrainer::Train(kwargs, nullptr, &model);
  if (!status.ok() || model.empty()) {
    throw DataError(fmt::format("SentencePiece training on {} failed: {}", inputs,
                                status.ok() ? "no model came back" : status.ToString()));
  }
  const std::filesystem::path out = args.out_dir / "tokenizer.model";
  StagedFile(out, std::as_bytes(std::span<const char>(model))).commit();
  return out;
}

}  // namespace meshtrain::data
