// src/meshtrain/data/sentencepiece_tokenizer.h
//
// SentencePiece models (Kudo & Richardson 2018) through Debian's libsentencepiece: a user's
// .model (e.g. Llama 2's) or one trained here by `meshtrain tokenizer train`
// (SentencePieceTrainer). Ids equal the Python package's SentencePieceProcessor.encode (no
// bos/eos added); tests/reference/tokenizer_reference.py checks that. The library is reached
// through the module libmeshtrain_spm.so, loaded on first use (spm_shim/spm_shim.h says why).
// Uses: core/error.h, spm_shim/spm_shim.h, dlopen.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/tokenizer.h"

struct MtSpm;  // spm_shim.h

namespace meshtrain::data {

/// A loaded SentencePiece model; thread-safe (the processor's encode is const).
class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Parses a serialized ModelProto; `path` names it in errors.
  /// Errors: DataError naming `path` when the bytes are not a SentencePiece model (truncated,
  /// garbage) or the model has no eos piece (the end-of-text id).
  SentencePieceTokenizer(std::string model_proto, const std::filesystem::path& path);
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  /// Reads and parses `model_file`. Errors: DataError naming a missing or unreadable file,
  /// and the constructor's.
  static std::unique_ptr<SentencePieceTokenizer> load(const std::filesystem::path& model_file);

  TokenizerKind kind() const noexcept override { return TokenizerKind::sentencepiece; }
  std::int64_t vocab_size() const noexcept override { return vocab_size_; }
  /// Errors: DataError when SentencePiece refuses the text.
  void encode(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> ids) const override;
  /// The model's eos id (Llama 2: 2).
  std::optional<std::int32_t> eot_id() const noexcept override { return eos_id_; }
  /// The model's bos id (Llama 2: 1), none when the model has no bos piece (bos_id = -1).
  std::optional<std::int32_t> bos_id() const noexcept {
    if (bos_id_ < 0 || bos_id_ >= vocab_size_) return std::nullopt;
    return bos_id_;
  }
  std::vector<std::string> file_names() const override { return {"tokenizer.model"}; }
  void save_files(const std::filesystem::path& dir) const override;

 private:
  std::string model_proto_;
  MtSpm* model_ = nullptr;  // owned; freed through the module
  std::int64_t vocab_size_ = 0;
  std::int32_t eos_id_ = -1;
  std::int32_t bos_id_ = -1;
};

/// What `meshtrain tokenizer train` asks SentencePieceTrainer for.
struct SentencePieceTrainArgs {
  std::vector<std::filesystem::path> inputs{};  // text files, one sentence per line
  std::string model_type = "bpe";               // "bpe" or "unigram"
  std::int64_t vocab_size = 0;                  // pieces, including <unk>, <s>, </s>
  double character_coverage = 1.0;              // share of characters kept (0.9995 for CJK)
  std::filesystem::path out_dir{};              // gets tokenizer.model
};

/// Trains a model and writes out_dir/tokenizer.model atomically; returns its path.
/// unk = 0, bos = 1, eos = 2 (SentencePiece's defaults, as Llama's), byte fallback off.
/// Errors: ConfigError (exit 2) for a model type other than bpe/unigram, a vocabulary size
/// outside [8, 1,000,000] or a coverage outside (0, 1]; DataError naming a missing input or
/// what SentencePiece reports (e.g. a vocabulary too large for the corpus).
std::filesystem::path train_sentencepiece(const SentencePieceTrainArgs& args);

}  // namespace meshtrain::data
