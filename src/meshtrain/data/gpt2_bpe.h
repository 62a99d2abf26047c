// src/meshtrain/data/gpt2_bpe.h
//
// GPT-2's byte-level BPE from OpenAI's two files: encoder.json (token string → id, the
// strings spelled through bytes_to_unicode below) and vocab.bpe ("#version: 0.2", then one
// merge "a b" per line in rank order). The ids equal tiktoken's "gpt2" encoding
// (tiktoken.load.data_gym_to_mergeable_bpe_ranks on the same files) and Hugging Face
// tokenizers' ByteLevel BPE; tests/reference/tokenizer_reference.py checks both.
// Uses: core/error.h, PCRE2 (the pre-tokenising regex), nlohmann_json.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "meshtrain/data/tokenizer.h"

namespace meshtrain::data {

/// GPT-2's pre-tokenising regex (OpenAI encoder.py, tiktoken's "gpt2" pat_str).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// OpenAI encoder.py's bytes_to_unicode(): byte b → the code point that spells it in
/// encoder.json/vocab.bpe. The 188 printable bytes '!'..'~', '¡'..'¬', '®'..'ÿ' map to
/// themselves; the other 68 to U+0100.. in byte order (so ' ' = 0x20 → 'Ġ' U+0120).
std::array<char32_t, 256> gpt2_byte_to_unicode();

/// The pieces GPT-2's regex splits `text` into, as byte ranges [begin, end), in order and
/// covering the text. PCRE2 with UTF + UCP (\p{L}, \s by Unicode properties) and
/// MATCH_INVALID_UTF: a maximal run of bytes that are not valid UTF-8 matches nothing and
/// becomes a piece of its own, so any bytes encode (and decode back to themselves).
struct Gpt2Piece {
  std::size_t begin = 0;
  std::size_t end = 0;
};

/// The compiled regex, JIT-compiled when PCRE2 has a JIT. Immutable and thread-safe.
class Gpt2Pretokenizer {
 public:
  Gpt2Pretokenizer();
  ~Gpt2Pretokenizer();
  Gpt2Pretokenizer(const Gpt2Pretokenizer&) = delete;
  Gpt2Pretokenizer& operator=(const Gpt2Pretokenizer&) = delete;

  /// Appends the pieces of `text` to `out`. Errors: DataError when PCRE2 fails (resource
  /// limits), naming the offset.
  void split(std::string_view text, std::vector<Gpt2Piece>& out) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

/// GPT-2 byte-level BPE: 50,257 ids, <|endoftext|> = 50256 the end-of-text id.
class Gpt2Bpe final : public Tokenizer {
 public:
  /// Parses the two files' contents; `encoder_path` and `merges_path` name them in errors.
  /// Errors: DataError naming the file when encoder.json is not a JSON object of distinct ids
  /// 0..n−1, a token uses a code point outside bytes_to_unicode, <|endoftext|> or a byte's
  /// token is missing, or a vocab.bpe line is not "a b" with a, b and ab all tokens.
  Gpt2Bpe(std::string_view encoder_json, std::string_view vocab_bpe,
          const std::filesystem::path& encoder_path, const std::filesystem::path& merges_path);

  /// Reads dir/encoder.json and dir/vocab.bpe. Errors: DataError naming a missing or
  /// unreadable file, and the constructor's.
  static std::unique_ptr<Gpt2Bpe> load(const std::filesystem::path& dir);

  TokenizerKind kind() const noexcept override { return TokenizerKind::gpt2_bpe; }
  std::int64_t vocab_size() const noexcept override {
    return static_cast<std::int64_t>(token_bytes_.size());
  }
  void encode(std::string_view text, std::vector<std::int32_t>& out) const override;
  /// Keeps back the last piece, and any piece that starts within 3 bytes of the end (the
  /// contractions 're/'ve/'ll look 3 bytes ahead), and an incomplete UTF-8 sequence at the
  /// end: every other match is decided by bytes inside `text` (the regex has no lookbehind;
  /// a run alternative stops at the first byte of another class, the one lookahead (?!\S)
  /// reads one byte past a whitespace run), so encoding resumes identically at the cut.
  std::size_t encode_prefix(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> ids) const override;
  std::optional<std::int32_t> eot_id() const noexcept override { return eot_id_; }
  std::vector<std::string> file_names() const override { return {"encoder.json", "vocab.bpe"}; }
  void save_files(const std::filesystem::path& dir) const override;

  /// The BPE ids of one pre-token's bytes: starting from one id per byte, repeatedly merges
  /// the adjacent pair of lowest rank (the leftmost on a tie), as tiktoken's byte_pair_merge.
  void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const;

 private:
  // Fill token_bytes_, id_of_, byte_id_, eot_id_ from encoder_json_, then merges_ from
  // vocab_bpe_; byte_of inverts gpt2_byte_to_unicode(). `path` names the file in errors.
  void read_encoder(const std::filesystem::path& path,
                    const std::unordered_map<char32_t, char>& byte_of);
  void read_merges(const std::filesystem::path& path,
                   const std::unordered_map<char32_t, char>& byte_of);
  void encode_pieces(std::string_view text, std::span<const Gpt2Piece> pieces,
                     std::vector<std::int32_t>& out) const;

  std::string encoder_json_;  // the files as read, for save_files()
  std::string vocab_bpe_;
  std::vector<std::string> token_bytes_;                 // id → bytes
  std::unordered_map<std::string, std::int32_t> id_of_;  // bytes → id (no special)
  std::array<std::int32_t, 256> byte_id_{};              // byte → id
  struct Merge {
    std::int32_t rank;
    std::int32_t id;
  };
  std::unordered_map<std::uint64_t, Merge> merges_;  // (left id << 32 | right id) → merge
  std::int32_t eot_id_ = 0;
  Gpt2Pretokenizer pretokenizer_;
};

}  // namespace meshtrain::data
