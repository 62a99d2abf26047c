// src/meshtrain/core/file_name.h — file names read from files (checkpoint metadata, safetensors
// indexes, meta.json), checked before use so that a hostile or damaged file cannot make
// meshtrain read or write outside the directory it describes.
#pragma once

#include <string_view>

namespace meshtrain {

/// True for the name of a file directly inside a directory: not empty, not "." or "..", and
/// free of "/", "\" and NUL (so neither a path into another directory nor an absolute one).
bool is_plain_file_name(std::string_view name) noexcept;

}  // namespace meshtrain
