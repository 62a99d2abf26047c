// src/meshtrain/data/tokenizer_files.h
//
// Reading a tokenizer's files (encoder.json, vocab.bpe, tokenizer.model) with the errors a
// user can act on. Internal to data/. Uses: core/error.h.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace meshtrain::data {

/// The bytes of `path`, a tokenizer file described as `what` ("GPT-2 vocab.bpe").
/// Errors: DataError naming the file and `what` when it is missing, not a regular file or
/// unreadable.
std::string read_tokenizer_file(const std::filesystem::path& path, std::string_view what);

}  // namespace meshtrain::data
