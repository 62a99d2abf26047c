// src/meshtrain/data/tokenizer.h
//
// The one interface behind which every vocabulary sits: the byte/char vocabulary of the main
// job (char_vocab.h), GPT-2's byte-level BPE (encoder.json + vocab.bpe, as OpenAI's
// encoder.py and tiktoken's "gpt2" encoding) and SentencePiece models (a user's .model, or one
// `meshtrain tokenizer train` made). A prepared dataset, a checkpoint and an export each carry
// the tokenizer's files and a TokenizerSpec in their JSON, so sampling and Hugging Face
// loading decode with the tokenizer the data was made with. Uses: core/error.h, char_vocab.h,
// gpt2_bpe.h, sentencepiece_tokenizer.h (the factory). docs/tokenizers.md describes them all.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::data {

class CharVocab;

/// Which tokenizer; names in JSON and on the command line: "char", "gpt2", "sentencepiece".
enum class TokenizerKind { char_bytes, gpt2_bpe, sentencepiece };

/// Maps text to token ids and back. Implementations are immutable after construction, so one
/// object may encode from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual TokenizerKind kind() const noexcept = 0;

  /// Number of ids; every id encode() returns is in [0, vocab_size()). GPT-2: 50,257.
  virtual std::int64_t vocab_size() const noexcept = 0;

  /// Appends the ids of `text` (UTF-8; the byte-level tokenizers take any bytes) to `out`.
  /// Special-token text such as "<|endoftext|>" is encoded as ordinary text, never as the
  /// special id (tiktoken's `encode_ordinary`): documents are separated by the caller with
  /// eot_id(), so a corpus cannot inject control tokens.
  /// Errors: DataError when a byte has no id (the char vocabulary only), naming the byte and
  /// its position.
  virtual void encode(std::string_view text, std::vector<std::int32_t>& out) const = 0;

  /// Streaming form of encode(): appends the ids of the longest prefix of `text` whose ids no
  /// continuation of the text can change, and returns that prefix's length in bytes (0 when
  /// no such prefix is known yet). prepare.h feeds a corpus chunk by chunk through this and
  /// calls encode() on what is left at the end of a document, which gives exactly the ids of
  /// encode() on the whole document. The char vocabulary consumes everything; GPT-2 keeps
  /// back its last pre-token (gpt2_bpe.h says why that suffices); SentencePiece keeps all,
  /// since its normaliser (dummy prefix, whitespace folding) has no provable restart point.
  virtual std::size_t encode_prefix(std::string_view text, std::vector<std::int32_t>& out) const;

  /// The text of `ids`. Errors: DataError naming the first id outside [0, vocab_size()) and
  /// its position.
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;

  /// The id placed between documents: GPT-2's <|endoftext|> (50256), SentencePiece's eos
  /// piece; none for the char vocabulary (its documents are just concatenated).
  virtual std::optional<std::int32_t> eot_id() const noexcept = 0;

  /// The files that recreate this tokenizer, by their name inside a directory (GPT-2:
  /// "encoder.json", "vocab.bpe"; SentencePiece: "tokenizer.model"; char: none, its byte list
  /// is in the spec). save_files() writes exactly these.
  virtual std::vector<std::string> file_names() const = 0;

  /// Writes file_names() into `dir` (which must exist). Errors: DataError naming the file.
  virtual void save_files(const std::filesystem::path& dir) const = 0;
};

/// "char", "gpt2", "sentencepiece": the names in meta.json.
std::string_view tokenizer_kind_name(TokenizerKind kind) noexcept;

/// Opens the tokenizer a command line names (`meshtrain prepare --tokenizer NAME`):
///   "char"       the byte vocabulary of the corpus: `corpus_chars` (prepare scans the inputs);
///   "gpt2"       the shipped data/tokenizers/gpt2 (searched relative to the current directory,
///                then to the source tree this binary was built from);
///   a directory  holding encoder.json + vocab.bpe (GPT-2 byte-level BPE);
///   a .model     file: a SentencePiece model.
/// Errors: DataError naming the name or file and what is expected, for an unknown name, a
/// missing/unreadable file, or a file that does not parse; "char" without `corpus_chars`.
std::unique_ptr<Tokenizer> open_tokenizer(std::string_view name,
                                          const CharVocab* corpus_chars = nullptr);

struct Metadata;

/// Recreates the tokenizer a meta.json describes from the files beside it in `dir` (a
/// dataset directory or a checkpoint directory). Errors: DataError naming the file when a
/// tokenizer file is missing or invalid, or when its vocabulary size differs from the
/// metadata's "vocab_size".
std::unique_ptr<Tokenizer> load_tokenizer(const Metadata& meta, const std::filesystem::path& dir);

}  // namespace meshtrain::data
