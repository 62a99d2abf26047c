#include "meshtrain/checkpoint/hf_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

constexpr std::uintmax_t kMaxFileBytes = 64ull << 20;
constexpr std::string_view kEndOfText = "<|endoftext|>";

std::string read_small_file(const fs::path& path, std::string_view what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw DataError(
        fmt::format("{}: the {} is missing (a run's tokenizer files lie beside its "
                    "meta.json)",
                    path.string(), what));
  }
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec || size > kMaxFileBytes) {
    throw DataError(fmt::format("{}: the {} is {} (at most {} bytes)", path.string(), what,
                                ec ? "unreadable" : "too large", kMaxFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw DataError(fmt::format("{}: cannot read the {}", path.string(), what));
  return text.str();
}

std::string dump(const ordered_json& j) { return j.dump(2) + "\n"; }

// encoder.json: {token: id}, every id in [0, vocab_size), <|endoftext|> present.
void check_encoder(const std::string& text, const fs::path& path, std::int64_t vocab_size) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw DataError(
        fmt::format("{}: not a JSON object of token → id (GPT-2's encoder.json)", path.string()));
  }
  for (const auto& [token, id] : j.items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
        id.get<std::int64_t>() >= vocab_size) {
      throw DataError(fmt::format("{}: token {} has id {}, outside the model's [0, {})",
                                  path.string(), nlohmann::json(token).dump(), id.dump(),
                                  vocab_size));
    }
  }
  if (!j.contains(std::string(kEndOfText))) {
    throw DataError(
        fmt::format("{}: no {} token (GPT-2's end-of-text)", path.string(), kEndOfText));
  }
}

HfTokenizerFiles gpt2_files(const fs::path& dir, std::int64_t vocab_size, std::int64_t max_len) {
  HfTokenizerFiles out;
  std::string encoder = read_small_file(dir / "encoder.json", "GPT-2 encoder.json");
  check_encoder(encoder, dir / "encoder.json", vocab_size);
  std::string merges = read_small_file(dir / "vocab.bpe", "GPT-2 vocab.bpe");
  if (!merges.starts_with("#version")) {
    // GPT2Tokenizer drops the first line of merges.txt unread: without the header the first
    // merge would be lost and the ids would differ.
    throw DataError(
        fmt::format("{}: the first line is not \"#version: …\" (GPT-2's vocab.bpe "
                    "starts with it)",
                    (dir / "vocab.bpe").string()));
  }
  const std::string eot(kEndOfText);
  const ordered_json config = {{"tokenizer_class", "GPT2Tokenizer"},
                               {"model_max_length", max_len},
                               {"bos_token", eot},
                               {"eos_token", eot},
                               {"unk_token", eot},
                               {"add_prefix_space", false},
                               {"add_bos_token", false},
                               {"errors", "replace"},
                               {"clean_up_tokenization_spaces", false}};
  const ordered_json special = {{"bos_token", eot}, {"eos_token", eot}, {"unk_token", eot}};
  out.files = {{"vocab.json", std::move(encoder)},
               {"merges.txt", std::move(merges)},
               {"tokenizer_config.json", dump(config)},
               {"special_tokens_map.json", dump(special)}};
  out.note = "GPT-2 BPE tokenizer (vocab.json, merges.txt) for AutoTokenizer";
  return out;
}

HfTokenizerFiles sentencepiece_files(const fs::path& dir, std::int64_t max_len) {
  HfTokenizerFiles out;
  std::string model = read_small_file(dir / "tokenizer.model", "SentencePiece tokenizer.model");
  if (model.empty()) {
    throw DataError(
        fmt::format("{}: empty SentencePiece model", (dir / "tokenizer.model").string()));
  }
  const ordered_json config = {{"tokenizer_class", "LlamaTokenizer"},
                               {"model_max_length", max_len},
                               {"bos_token", "<s>"},
                               {"eos_token", "</s>"},
                               {"unk_token", "<unk>"},
                               {"add_bos_token", false},
                               {"add_eos_token", false},
                               {"legacy", true},
                               {"clean_up_tokenization_spaces", false}};
  const ordered_json special = {
      {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
  out.files = {{"tokenizer.model", std::move(model)},
               {"tokenizer_config.json", dump(config)},
               {"special_tokens_map.json", dump(special)}};
  out.note = "SentencePiece tokenizer (tokenizer.model) for AutoTokenizer as LlamaTokenizer";
  return out;
}

}  // namespace

HfTokenizerFiles read_hf_tokenizer(std::string_view kind, const fs::path& source_dir,
                                   std::int64_t vocab_size, std::int64_t model_max_length) {
  if (kind == "gpt2") return gpt2_files(source_dir, vocab_size, model_max_length);
  if (kind == "sentencepiece") return sentencepiece_files(source_dir, model_max_length);
  if (kind == "char") {
    return {.files = {},
            .note =
                "no tokenizer files: Hugging Face has no tokenizer class for meshtrain's "
                "char vocabulary (decode with meshtrain sample, or map ids through "
                "meta.json's \"chars\")"};
  }
  throw DataError(fmt::format("{}: unknown tokenizer kind \"{}\" (char, gpt2 or sentencepiece)",
                              source_dir.string(), kind));
}

std::vector<std::string> write_hf_tokenizer(const HfTokenizerFiles& files, const fs::path& dir) {
  for (const HfTokenizerFiles::File& f : files.files) {
    StagedFile(dir / f.name, std::as_bytes(std::span<const char>(f.bytes))).commit();
  }
  std::vector<std::string> removed;
  for (const std::string_view name : kHfTokenizerFileNames) {
    const bool written = std::ranges::any_of(
        files.files, [&](const HfTokenizerFiles::File& f) { return f.name == name; });
    const fs::path path = dir / name;
    std::error_code ec;
    if (written || !fs::exists(fs::symlink_status(path, ec))) continue;
    if (!fs::remove(path, ec) || ec) {
      throw DataError(
          fmt::format("cannot remove {} (an earlier export's tokenizer file, which "
                      "AutoTokenizer would load for this model): {}",
                      path.string(), ec.message()));
    }
    removed.emplace_back(name);
  }
  return removed;
}

}  // namespace meshtrain
