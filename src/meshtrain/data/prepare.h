// src/meshtrain/data/prepare.h
//
// Corpus → token files for character-level training, as nanoGPT's
// data/shakespeare_char/prepare.py: the same vocabulary, split point and uint16 files, plus a
// meta.json sidecar (metadata.h). Uses: char_vocab.h, metadata.h, staged_file.h.
#pragma once

#include <cstdint>
#include <filesystem>

namespace meshtrain::data {

/// What prepare_char_dataset wrote.
struct PrepareResult {
  std::filesystem::path train_bin;  // <out_dir>/train.bin
  std::filesystem::path val_bin;    // <out_dir>/val.bin
  std::filesystem::path meta_json;  // <out_dir>/meta.json
  std::int64_t vocab_size = 0;      // distinct bytes of the text
  std::int64_t train_tokens = 0;    // int(n · 0.9), n = bytes of the text
  std::int64_t val_tokens = 0;      // n − train_tokens
};

/// Reads the text file `text`, builds its CharVocab, encodes every byte and writes
///   train.bin  the first int(n·0.9) ids (Python's int() of the double product, as nanoGPT)
///   val.bin    the remaining ids
///   meta.json  vocabulary and counts (metadata.h)
/// into `out_dir` (created if missing). Token files are raw little-endian uint16, one per
/// byte of text, no header — nanoGPT's format, readable with np.memmap(dtype=np.uint16).
/// Tiny Shakespeare (1,115,394 bytes, 65 distinct) gives 1,003,854 / 111,540 tokens.
///
/// Atomic: all three files are written and fsynced under temporary names first; then an old
/// meta.json is removed, the .bin files are renamed into place and meta.json is renamed
/// last. So a directory whose meta.json exists holds one complete run's files, and a failed
/// run leaves no partial file behind.
///
/// Errors: DataError naming the path and what to do when `text` is missing, not a regular
/// file, unreadable, or too short to give both splits a token (fewer than 2 bytes), or when
/// `out_dir` cannot be created or written.
PrepareResult prepare_char_dataset(const std::filesystem::path& text,
                                   const std::filesystem::path& out_dir);

}  // namespace meshtrain::data
