#include "meshtrain/checkpoint/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/core/half.h"
#include "meshtrain/core/staged_file.h"

namespace meshtrain {
namespace {

std::string dtype_tag(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::i32:
      return "I32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
  }
  return "?";
}

// Safetensors' own limit on the header (MAX_HEADER_SIZE in huggingface/safetensors): a larger
// length field is a damaged or hostile file, refused before anything that size is allocated.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeTag {
  const char* tag;
  DType dtype;
};
constexpr DTypeTag kTags[] = {
    {"F32", DType::f32}, {"I32", DType::i32}, {"BF16", DType::bf16}, {"F16", DType::f16}};

// The shape of entry `name`: an array of integers ≥ 0 whose product times `element_bytes` fits
// in `data_size` bytes (checked without overflow: a hostile shape never wraps around).
Shape parse_shape(const nlohmann::json& j, std::uint64_t element_bytes, std::uint64_t data_size,
                  const std::string& name, const std::filesystem::path& path) {
  if (!j.is_array()) {
    throw DataError(
        fmt::format("{}: tensor {} has a shape that is not an array", path.string(), name));
  }
  Shape shape;
  std::uint64_t bytes = element_bytes;
  for (const nlohmann::json& d : j) {
    if (!d.is_number_unsigned()) {
      throw DataError(fmt::format("{}: tensor {} has a dimension {} that is not an integer ≥ 0",
                                  path.string(), name, d.dump()));
    }
    const std::uint64_t n = d.get<std::uint64_t>();
    // The byte bound below lets any dimension follow a 0; stored as int64, one above 2^63 − 1
    // would be negative.
    if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw DataError(fmt::format("{}: tensor {} has a dimension {} above 2^63 − 1 in shape {}",
                                  path.string(), name, n, j.dump()));
    }
    if (n != 0 && bytes > data_size / n) {
      throw DataError(fmt::format("{}: tensor {} of shape {} needs more bytes than the file holds",
                                  path.string(), name, j.dump()));
    }
    bytes *= n;
    shape.push_back(static_cast<std::int64_t>(n));
  }
  return shape;
}

// One tensor's entry of the header; `data_size`: the bytes after the header.
SafetensorsEntry parse_entry(const nlohmann::json& entry, const std::string& name,
                             std::uint64_t length, std::uint64_t data_size, bool allow_16bit,
                             const std::filesystem::path& path) {
  const std::string tag = entry.at("dtype").get<std::string>();
  const auto* known = std::find_if(std::begin(kTags), std::end(kTags),
                                   [&](const DTypeTag& t) { return tag == t.tag; });
  if (known == std::end(kTags) || (!allow_16bit && is_16bit_float(known->dtype))) {
    throw DataError(fmt::format("{}: tensor {} has dtype {}; only {} are supported here",
                                path.string(), name, tag,
                                allow_16bit ? "F32, BF16, F16 and I32" : "F32 and I32"));
  }
  const std::uint64_t element = dtype_size(known->dtype);
  const Shape shape = parse_shape(entry.at("shape"), element, data_size, name, path);
  const auto offsets = entry.at("data_offsets").get<std::vector<std::uint64_t>>();
  const std::uint64_t bytes = static_cast<std::uint64_t>(shape_numel(shape)) * element;
  if (offsets.size() != 2 || offsets[1] < offsets[0] || offsets[1] > data_size ||
      offsets[1] - offsets[0] != bytes) {
    throw DataError(fmt::format(
        "{}: tensor {} ({} {}, {} bytes) has data offsets {} outside the file's {} data bytes "
        "or not matching its dtype and shape (file truncated or damaged?)",
        path.string(), name, tag, to_string(shape), bytes, entry.at("data_offsets").dump(),
        data_size));
  }
  return {.dtype = known->dtype, .shape = shape, .offset = 8 + length + offsets[0]};
}

// The header `text` (`length` bytes) of a file of `file_size` bytes, checked against it.
SafetensorsIndex parse_header(const std::string& text, std::uint64_t length,
                              std::uint64_t file_size, bool allow_16bit,
                              const std::filesystem::path& path) {
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    throw DataError(fmt::format("{}: malformed JSON header", path.string()));
  }
  const std::uint64_t data_size = file_size - 8 - length;
  SafetensorsIndex out;
  out.path = path;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw DataError(fmt::format("{}: bad __metadata__", path.string()));
      for (const auto& [k, v] : entry.items()) {
        if (v.is_string()) out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      out.entries.emplace(name, parse_entry(entry, name, length, data_size, allow_16bit, path));
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: malformed entry for {}: {}", path.string(), name, e.what()));
    }
  }
  return out;
}

// The header length of a file of `file_size` bytes starting with `length`, checked.
void check_header_length(std::uint64_t length, std::uint64_t file_size,
                         const std::filesystem::path& path) {
  if (length > kMaxHeaderBytes) {
    throw DataError(fmt::format(
        "{}: header length {} exceeds safetensors' limit of {} bytes (not a safetensors file, "
        "or a damaged one)",
        path.string(), length, kMaxHeaderBytes));
  }
  if (length > file_size - 8) {
    throw DataError(fmt::format("{}: header length {} exceeds the file ({} bytes)", path.string(),
                                length, file_size));
  }
}

}  // namespace

std::vector<std::byte> encode_safetensors(const std::vector<NamedTensor>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::int64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    header[t.name] = {{"dtype", dtype_tag(t.tensor.dtype())},
                      {"shape", t.tensor.shape()},
                      {"data_offsets", {offset, offset + t.tensor.bytes()}}};
    offset += t.tensor.bytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const std::uint64_t length = text.size();
  std::vector<std::byte> out(8 + text.size() + static_cast<std::size_t>(offset));
  std::memcpy(out.data(), &length, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::byte* data = out.data() + 8 + text.size();
  for (const NamedTensor& t : tensors) {
    if (t.tensor.bytes() == 0) continue;
    const DType d = t.tensor.dtype();
    const void* from = d == DType::i32   ? static_cast<const void*>(t.tensor.i32())
                       : d == DType::f32 ? static_cast<const void*>(t.tensor.f32())
                                         : static_cast<const void*>(t.tensor.u16());
    std::memcpy(data, from, static_cast<std::size_t>(t.tensor.bytes()));
    data += t.tensor.bytes();
  }
  return out;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  StagedFile(path, encode_safetensors(tensors, metadata)).commit();
}

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open (missing or unreadable)", path.string()));
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw DataError(fmt::format("{}: cannot read its size: {}", path.string(), ec.message()));
  std::vector<std::byte> bytes(size);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!in) throw DataError(fmt::format("{}: read failed", path.string()));
  return bytes;
}

SafetensorsIndex read_safetensors_index(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open (missing or unreadable)", path.string()));
  std::error_code ec;
  const std::uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec || file_size < 8)
    throw DataError(fmt::format("{}: not a safetensors file (too short)", path.string()));
  std::uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  check_header_length(length, file_size, path);
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  if (!in) throw DataError(fmt::format("{}: read of the header failed", path.string()));
  return parse_header(text, length, file_size, /*allow_16bit=*/true, path);
}

Tensor read_safetensors_tensor(const SafetensorsIndex& index, const std::string& name) {
  const auto it = index.entries.find(name);
  if (it == index.entries.end()) {
    throw DataError(fmt::format("{}: no tensor {}", index.path.string(), name));
  }
  const SafetensorsEntry& e = it->second;
  Tensor t = Tensor::empty(e.shape, MemCategory::other, e.dtype);
  if (t.bytes() == 0) return t;
  std::ifstream in(index.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(e.offset));
  char* data = e.dtype == DType::f32   ? reinterpret_cast<char*>(t.f32())
               : e.dtype == DType::i32 ? reinterpret_cast<char*>(t.i32())
                                       : reinterpret_cast<char*>(t.u16());
  in.read(data, static_cast<std::streamsize>(t.bytes()));
  if (!in) throw DataError(fmt::format("{}: read of {} failed", index.path.string(), name));
  return t;
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  SafetensorsIndex index = read_safetensors_index(path);
  SafetensorsFile out;
  for (const auto& [name, entry] : index.entries) {
    if (is_16bit_float(entry.dtype)) {  // meshtrain's own files are F32 / I32
      throw DataError(
          fmt::format("{}: tensor {} has a 16-bit dtype; only F32 and I32 are "
                      "supported here",
                      path.string(), name));
    }
    out.tensors.emplace(name, read_safetensors_tensor(index, name));
  }
  out.metadata = std::move(index.metadata);
  return out;
}

SafetensorsFile decode_safetensors(std::span<const std::byte> bytes,
                                   const std::filesystem::path& path) {
  if (bytes.size() < 8) {
    throw DataError(fmt::format("{}: not a safetensors file (too short)", path.string()));
  }
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  check_header_length(length, bytes.size(), path);
  const std::string text(reinterpret_cast<const char*>(bytes.data()) + 8, length);
  SafetensorsIndex index = parse_header(text, length, bytes.size(), /*allow_16bit=*/false, path);
  SafetensorsFile out;
  for (const auto& [name, e] : index.entries) {
    Tensor t = Tensor::empty(e.shape, MemCategory::other, e.dtype);
    void* to = e.dtype == DType::f32 ? static_cast<void*>(t.f32()) : static_cast<void*>(t.i32());
    if (t.bytes() > 0)
      std::memcpy(to, bytes.data() + e.offset, static_cast<std::size_t>(t.bytes()));
    out.tensors.emplace(name, std::move(t));
  }
  out.metadata = std::move(index.metadata);
  return out;
}

}  // namespace meshtrain
