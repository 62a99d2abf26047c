// src/meshtrain/data/metadata.h
//
// The files of a prepared dataset and its meta.json sidecar, which records the tokenizer
// (its files lie beside meta.json) so that training and sampling use the ids as prepared.
// Uses: core/error.h, nlohmann_json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/data/char_vocab.h"
#include "meshtrain/data/token_file.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain::data {

/// File names inside a prepared dataset directory.
inline constexpr std::string_view kTrainBinName = "train.bin";
inline constexpr std::string_view kValBinName = "val.bin";
inline constexpr std::string_view kMetaJsonName = "meta.json";
/// Values of meta.json's "format": v2 is written; v1 (char only, before issue 15) still loads.
inline constexpr std::string_view kCharFormat = "meshtrain-char-v1";
inline constexpr std::string_view kTokensFormat = "meshtrain-tokens-v2";

/// What meta.json holds (v2; docs/tokenizers.md has every field):
///   {"format": "meshtrain-tokens-v2",
///    "tokenizer": {"kind": "gpt2", "files": ["encoder.json", "vocab.bpe"]},
///    "vocab_size": 50257, "token_dtype": "uint16", "eot_id": 50256,
///    "sources": ["data/tinyshakespeare.txt"], "document_separator": null,
///    "val_fraction": 0.1, "train_tokens": 301966, "val_tokens": 36059}
/// A char tokenizer is {"kind": "char", "chars": [10, 32, ...]} (the byte of each id) with
/// "eot_id": null. The tokenizer's files lie beside meta.json. v1 was
///   {"format": "meshtrain-char-v1", "vocab_size": 65, "chars": [...], "source": "...",
///    "train_tokens": ..., "val_tokens": ...}.
struct Metadata {
  TokenizerKind tokenizer = TokenizerKind::char_bytes;
  CharVocab vocab{};                           // the char tokenizer's bytes (char only)
  std::vector<std::string> tokenizer_files{};  // beside meta.json (none for char)
  std::int64_t vocab_size = 0;                 // ids of the tokenizer
  TokenDtype token_dtype = TokenDtype::u16;    // width of the ids in train.bin / val.bin
  std::optional<std::int32_t> eot_id{};        // between documents; none for char
  std::vector<std::string> sources{};          // the text files, as given to prepare
  std::string document_separator{};            // split inside files on this ("" = none)
  double val_fraction = 0.1;                   // last share of the text that is val
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
};

/// "uint16" / "uint32".
std::string_view token_dtype_name(TokenDtype dtype) noexcept;

/// Serialises `meta` as v2 JSON: one key per line in the order above, trailing newline.
std::string metadata_to_json(const Metadata& meta);

/// Reads and validates a meta.json, v2 or v1.
/// Errors: DataError naming `meta_json` when it is missing or unreadable, is not valid JSON,
/// has another "format", lacks a field or has one of the wrong type, names an unknown
/// tokenizer kind or a tokenizer file that is not a plain name, or has a "chars" list that is
/// not strictly increasing bytes of length "vocab_size".
Metadata load_metadata(const std::filesystem::path& meta_json);

}  // namespace meshtrain::data
