// src/meshtrain/data/metadata.h
//
// The files of a prepared character dataset and its meta.json sidecar, which records the
// vocabulary so that sampling can decode ids without the original text.
// Uses: core/error.h, nlohmann_json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "meshtrain/data/char_vocab.h"
#include "meshtrain/data/token_file.h"

namespace meshtrain::data {

/// File names inside a prepared dataset directory.
inline constexpr std::string_view kTrainBinName = "train.bin";
inline constexpr std::string_view kValBinName = "val.bin";
inline constexpr std::string_view kMetaJsonName = "meta.json";
/// Value of meta.json's "format"; a reader refuses anything else.
inline constexpr std::string_view kCharFormat = "meshtrain-char-v1";

/// What meta.json holds.
///   {"format": "meshtrain-char-v1", "vocab_size": 65, "chars": [10, 32, 33, ...],
///    "source": "data/tinyshakespeare.txt", "train_tokens": 1003854, "val_tokens": 111540}
/// "chars" lists the byte of each id in id order.
struct Metadata {
  CharVocab vocab;
  std::int64_t vocab_size = 0;                // ids of the tokenizer (= vocab.size() for char)
  TokenDtype token_dtype = TokenDtype::u16;   // width of the ids in train.bin / val.bin
  std::string source;  // the text file the dataset was prepared from, as given to prepare
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
};

/// Serialises `meta` as the JSON above: one key per line in that order, trailing newline.
std::string metadata_to_json(const Metadata& meta);

/// Reads and validates a meta.json.
/// Errors: DataError naming `meta_json` when it is missing or unreadable, is not valid JSON,
/// has another "format", lacks a field or has one of the wrong type, or has a "chars" list
/// that is not strictly increasing bytes of length "vocab_size".
Metadata load_metadata(const std::filesystem::path& meta_json);

}  // namespace meshtrain::data
