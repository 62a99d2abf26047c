// src/meshtrain/checkpoint/safetensors.h
//
// Reading and writing the safetensors format (Hugging Face): an 8-byte little-endian header
// length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the raw little-endian data. meshtrain writes and reads back f32
// ("F32") and i32 ("I32"); the header-only reader below also accepts bf16 ("BF16") and f16
// ("F16"), the dtypes of Hugging Face's 16-bit model files. Every header is checked before any
// data is read: length at most 100 MB (safetensors' own limit), dimensions integers ≥ 0, and
// each tensor's data_offsets inside the file and spanning exactly dtype size × elements bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/core/tensor.h"

namespace meshtrain {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

/// Writes atomically (core/staged_file.h: a temporary name, fsync, rename). Throws DataError when
/// the file cannot be written (the previous file at `path`, if any, is left as it was).
void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // MemCategory::other unless copied elsewhere
  std::map<std::string, std::string> metadata;
};

/// Throws DataError (naming the path and what is wrong) for a missing file, a truncated file,
/// a malformed or oversized header, a dtype other than F32/I32, or offsets outside the data
/// or disagreeing with the dtype and shape; never crashes.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

/// The bytes of a safetensors file holding `tensors` (f32, i32, or bf16/f16 as Hugging Face's
/// 16-bit files hold them), as write_safetensors writes
/// them: for a caller that hashes or writes them itself (sharded checkpoints).
std::vector<std::byte> encode_safetensors(const std::vector<NamedTensor>& tensors,
                                          const std::map<std::string, std::string>& metadata = {});
/// read_safetensors on bytes already in memory; `path` only names them in errors.
SafetensorsFile decode_safetensors(std::span<const std::byte> bytes,
                                   const std::filesystem::path& path);
/// The whole file. Throws DataError naming the path when it is missing or unreadable.
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);
/// Where one tensor of a safetensors file lies: dtype, shape, byte offset from the file's start.
struct SafetensorsEntry {
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t offset = 0;
};

/// A safetensors file's header alone, so that a reader can load one tensor at a time (import
/// of a model bigger than one rank should hold).
struct SafetensorsIndex {
  std::filesystem::path path;
  std::map<std::string, SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};

/// Reads and checks the header only: the same DataErrors as read_safetensors, except that
/// BF16 and F16 tensors are accepted (Hugging Face model files; see HfImport).
SafetensorsIndex read_safetensors_index(const std::filesystem::path& path);

/// Reads tensor `name` of `index` (MemCategory::other) in its stored dtype (bf16/f16 as
/// their bit patterns, Tensor::u16(); widen with Tensor::to). Throws DataError naming the file and
/// the tensor when it is not in the index or the read fails (file changed since indexed).
Tensor read_safetensors_tensor(const SafetensorsIndex& index, const std::string& name);

}  // namespace meshtrain
