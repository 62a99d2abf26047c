// src/meshtrain/data/char_vocab.h
//
// Character-level vocabulary in the manner of nanoGPT's data/shakespeare_char/prepare.py:
// the ids are the text's distinct characters in sorted order. Uses: core/error.h.
// Knows nothing of files; prepare.h and metadata.h store and load it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshtrain/data/tokenizer.h"

namespace meshtrain::data {

/// Maps each of up to 256 distinct bytes to an id in [0, size()), ids in ascending byte order.
///
/// nanoGPT sorts Python characters (code points); we sort bytes. The two agree on ASCII text
/// such as Tiny Shakespeare; on UTF-8 text a multi-byte character becomes several ids here,
/// which keeps the vocabulary ≤ 256 and every token a uint16.
class CharVocab {
 public:
  /// An empty vocabulary (size 0): encode() rejects every character.
  CharVocab();

  /// The sorted distinct bytes of `text`.
  static CharVocab from_text(std::string_view text);

  /// The vocabulary whose id i is byte chars[i]. Errors: DataError when `chars` is empty or
  /// not strictly increasing (such a list was not written by from_text).
  static CharVocab from_chars(std::vector<std::uint8_t> chars);

  /// Number of ids, 1..256 (0 only for a default-constructed vocabulary).
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(chars_.size()); }

  /// The byte of each id, ascending.
  std::span<const std::uint8_t> chars() const noexcept { return chars_; }

  /// One id per byte of `text`, each in [0, size()).
  /// Errors: DataError naming the character (and its byte value and position) when a byte of
  /// `text` is not in the vocabulary.
  std::vector<std::int32_t> encode(std::string_view text) const;

  /// The bytes of `ids`, concatenated. Errors: DataError naming the id and its position when
  /// an id is outside [0, size()).
  std::string decode(std::span<const std::int32_t> ids) const;

 private:
  explicit CharVocab(std::vector<std::uint8_t> sorted_chars);

  std::vector<std::uint8_t> chars_;           // id -> byte
  std::array<std::int16_t, 256> id_of_byte_;  // byte -> id, -1 when absent
};

/// The char vocabulary behind the Tokenizer interface (the main job's default). No end-of-
/// text id (documents are concatenated) and no files (meta.json lists the bytes).
class CharTokenizer final : public Tokenizer {
 public:
  explicit CharTokenizer(CharVocab vocab) : vocab_(std::move(vocab)) {}

  const CharVocab& vocab() const noexcept { return vocab_; }

  TokenizerKind kind() const noexcept override { return TokenizerKind::char_bytes; }
  std::int64_t vocab_size() const noexcept override { return vocab_.size(); }
  void encode(std::string_view text, std::vector<std::int32_t>& out) const override;
  /// Every byte is final: encodes all of `text`.
  std::size_t encode_prefix(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> ids) const override {
    return vocab_.decode(ids);
  }
  std::optional<std::int32_t> eot_id() const noexcept override { return std::nullopt; }
  std::vector<std::string> file_names() const override { return {}; }
  void save_files(const std::filesystem::path&) const override {}

 private:
  CharVocab vocab_;
};

/// "'a' (byte 97)" for a printable ASCII byte, "byte 0xc3" otherwise: bytes as a user can
/// find them in the text.
std::string describe_byte(std::uint8_t byte);

}  // namespace meshtrain::data
