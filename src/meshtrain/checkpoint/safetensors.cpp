#include "meshtrain/checkpoint/safetensors.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
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
    const void* from = t.tensor.dtype() == DType::i32 ? static_cast<const void*>(t.tensor.i32())
                                                      : static_cast<const void*>(t.tensor.f32());
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

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  return decode_safetensors(read_file_bytes(path), path);
}

SafetensorsFile decode_safetensors(std::span<const std::byte> bytes,
                                   const std::filesystem::path& path) {
  const std::uint64_t file_size = bytes.size();
  if (file_size < 8)
    throw DataError(fmt::format("{}: not a safetensors file (too short)", path.string()));
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  if (length > file_size - 8) {
    throw DataError(fmt::format("{}: header length {} exceeds the file ({} bytes)", path.string(),
                                length, file_size));
  }
  const std::string text(reinterpret_cast<const char*>(bytes.data()) + 8, length);
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    throw DataError(fmt::format("{}: malformed JSON header", path.string()));
  }
  const std::uint64_t data_size = file_size - 8 - length;
  const std::byte* data = bytes.data() + 8 + length;
  SafetensorsFile out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw DataError(fmt::format("{}: bad __metadata__", path.string()));
      for (const auto& [k, v] : entry.items()) {
        if (v.is_string()) out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      const std::string tag = entry.at("dtype").get<std::string>();
      if (tag != "F32" && tag != "I32") {
        throw DataError(fmt::format("{}: tensor {} has dtype {}; only F32 and I32 are supported",
                                    path.string(), name, tag));
      }
      const Shape shape = entry.at("shape").get<Shape>();
      const auto offsets = entry.at("data_offsets").get<std::vector<std::uint64_t>>();
      for (const std::int64_t d : shape) {
        if (d < 0)
          throw DataError(fmt::format("{}: tensor {} has a negative dim", path.string(), name));
      }
      const std::uint64_t n = static_cast<std::uint64_t>(shape_numel(shape)) * 4;
      if (offsets.size() != 2 || offsets[1] < offsets[0] || offsets[1] > data_size ||
          offsets[1] - offsets[0] != n) {
        throw DataError(
            fmt::format("{}: tensor {} has data offsets outside the file or not "
                        "matching its shape (file truncated?)",
                        path.string(), name));
      }
      Tensor t = Tensor::empty(shape, MemCategory::other, tag == "F32" ? DType::f32 : DType::i32);
      void* to = tag == "F32" ? static_cast<void*>(t.f32()) : static_cast<void*>(t.i32());
      if (n > 0) std::memcpy(to, data + offsets[0], n);
      out.tensors.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: malformed entry for {}: {}", path.string(), name, e.what()));
    }
  }
  return out;
}

}  // namespace meshtrain
