// src/meshtrain/data/prepare.h
//
// Corpus → token files, streaming: text files of any size are read in chunks (constant
// memory), tokenized by any Tokenizer and written as raw little-endian uint16/uint32 ids with
// a meta.json sidecar (metadata.h) and the tokenizer's files. With the char tokenizer and one
// file this is nanoGPT's data/shakespeare_char/prepare.py; with "gpt2" nanoGPT's
// data/shakespeare/prepare.py (the split taken on characters, each side encoded on its own).
// Uses: tokenizer.h, metadata.h, core/staged_file.h. docs/tokenizers.md describes the options.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/data/token_file.h"

namespace meshtrain::data {

/// What `meshtrain prepare` is asked for.
struct PrepareOptions {
  std::vector<std::filesystem::path> inputs{};  // text files; each one is a document
  std::filesystem::path out_dir{};  // gets train.bin, val.bin, meta.json, tokenizer files
  std::string tokenizer = "char";   // open_tokenizer()'s name
  double val_fraction = 0.1;        // the last share of the text that becomes val.bin
  /// Also split documents inside files at this literal text, which is dropped (TinyStories'
  /// "<|endoftext|>"); "" = files are the only document boundaries.
  std::string document_separator{};
  bool progress = false;               // throttled progress lines (bytes, rate, ETA) on stderr
  std::size_t chunk_bytes = 1u << 20;  // read and encode granularity (tests make it small)
};

/// What prepare_dataset wrote.
struct PrepareResult {
  std::filesystem::path train_bin{};  // <out_dir>/train.bin
  std::filesystem::path val_bin{};    // <out_dir>/val.bin
  std::filesystem::path meta_json{};  // <out_dir>/meta.json
  std::int64_t vocab_size = 0;
  TokenDtype token_dtype = TokenDtype::u16;
  std::int64_t text_bytes = 0;  // of all inputs
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
};

/// Two passes over `inputs` as one text (their concatenation):
///   1. scan: bytes, characters (UTF-8 lead bytes) and the set of bytes (the char vocabulary);
///   2. encode: the text is cut once, at unit int(n·(1 − val_fraction)) (Python's int() of
///      the double product, as nanoGPT), where a unit is a byte for the char tokenizer and a
///      character otherwise; the part before is train, the rest val. Each side is split into
///      documents at file ends and at `document_separator`; empty documents are dropped; the
///      tokenizer's eot id (none for char) is written between consecutive documents of a side.
/// Tokens are uint16 when the vocabulary has ≤ 65,536 ids, else uint32. Memory is bounded by
/// a few chunks plus, for GPT-2, the longest pre-token and, for SentencePiece, the longest
/// document (its normaliser has no restart point, tokenizer.h).
/// Tiny Shakespeare: char gives 1,003,854 / 111,540 tokens, gpt2 301,966 / 36,059.
///
/// Atomic: the token files and meta.json are written and fsynced under temporary names; then
/// an old meta.json is removed, the tokenizer files and .bin files are put in place and
/// meta.json is renamed last. A directory whose meta.json exists holds one run's files, and a
/// run that fails with an error leaves no partial file behind (a killed one can leave its
/// temporary files, which nothing reads).
///
/// Errors: DataError naming the path and what to do when an input is missing, not a regular
/// file or unreadable, when the text is too short to give both sides a unit, when the
/// tokenizer cannot be opened (open_tokenizer), or when `out_dir` cannot be written;
/// ConfigError for val_fraction outside (0, 1).
PrepareResult prepare_dataset(const PrepareOptions& options);

/// prepare_dataset of one file with the char tokenizer and the default split.
PrepareResult prepare_char_dataset(const std::filesystem::path& text,
                                   const std::filesystem::path& out_dir);

}  // namespace meshtrain::data
