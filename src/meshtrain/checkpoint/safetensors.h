// src/meshtrain/checkpoint/safetensors.h
//
// Reading and writing the safetensors format (Hugging Face): an 8-byte little-endian header
// length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the raw little-endian data. f32 ("F32") and i32 ("I32") only.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/core/tensor.h"

namespace meshtrain {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

/// Writes atomically: `<path>.tmp`, fsync, rename. Throws DataError when the file cannot be
/// written (the previous file at `path`, if any, is left as it was).
void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // MemCategory::other unless copied elsewhere
  std::map<std::string, std::string> metadata;
};

/// Throws DataError (naming the path and what is wrong) for a missing file, a truncated file,
/// a malformed header, an unsupported dtype, or offsets outside the data; never crashes.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

}  // namespace meshtrain
