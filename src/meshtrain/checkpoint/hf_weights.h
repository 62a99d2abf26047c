// src/meshtrain/checkpoint/hf_weights.h
//
// The safetensors file(s) of a Hugging Face model, as `checkpoint.init_from` names them: one
// `model.safetensors`, a sharded model's `model.safetensors.index.json` (transformers'
// save_pretrained with max_shard_size: {"metadata": {...}, "weight_map": {tensor: shard file}},
// the shards beside the index), or a directory holding either (model.safetensors first). Only
// the headers are read on opening; tensors one at a time, widened to f32.
//
// A hostile index cannot make meshtrain read outside the index's directory: every shard must
// be a plain file name (no "/", "\", "..", absolute path or empty name). Every tensor the index
// maps to a shard must be in that shard's header, and every tensor of a shard must be mapped to
// it (no tensor twice). Symbolic links among the shards are followed (the Hugging Face hub
// cache links each file into its snapshot directory).
// Uses: checkpoint/safetensors.h, core/.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/safetensors.h"

namespace meshtrain {

struct HfWeights {
  /// One tensor: which of `files` holds it, and where.
  struct Located {
    std::size_t file = 0;
    SafetensorsEntry entry;
  };

  std::filesystem::path source;  // what checkpoint.init_from named: file, index or directory
  std::filesystem::path dir;     // the directory of the file(s), where config.json would be
  std::vector<SafetensorsIndex> files;
  std::map<std::string, Located> tensors;
  std::map<std::string, std::string> metadata;  // the first file's __metadata__

  /// What to name in messages: the file, or the index for a sharded model.
  std::string name() const { return source.string(); }
  /// The file holding `tensor` (MT_CHECKed to be present).
  const std::filesystem::path& file_of(const std::string& tensor) const;
};

/// Opens `path` (a .safetensors file, a model.safetensors.index.json, or a directory holding
/// model.safetensors or model.safetensors.index.json) and reads every header. Throws DataError
/// naming the path for a missing file, a directory with neither file, a malformed index (not
/// JSON, no weight_map object, a shard name that is not a string), a shard name that is not a
/// plain file name, a tensor missing from its shard or in a shard the index does not map it to,
/// and every DataError of read_safetensors_index for each file.
HfWeights open_hf_weights(const std::filesystem::path& path);

/// Tensor `name` of `weights` as f32 (BF16 and F16 widened exactly, core/half.h; F32 as
/// stored), MemCategory::other. Throws DataError naming the file for an I32 tensor, a tensor not
/// in `weights`, or a failed read.
Tensor read_hf_tensor_f32(const HfWeights& weights, const std::string& name);

}  // namespace meshtrain
