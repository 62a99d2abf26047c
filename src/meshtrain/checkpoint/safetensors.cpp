#include "meshtrain/checkpoint/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"

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

void write_all(int fd, const void* data, std::size_t n, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0)
      throw DataError(fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
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

  const std::filesystem::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    throw DataError(fmt::format("cannot create {}: {}", tmp.string(), std::strerror(errno)));
  }
  try {
    write_all(fd, &length, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const NamedTensor& t : tensors) {
      if (t.tensor.bytes() > 0) {
        const void* data = t.tensor.dtype() == DType::i32
                               ? static_cast<const void*>(t.tensor.i32())
                               : static_cast<const void*>(t.tensor.f32());
        write_all(fd, data, static_cast<std::size_t>(t.tensor.bytes()), tmp);
      }
    }
    if (::fsync(fd) != 0) throw DataError(fmt::format("fsync {} failed", tmp.string()));
  } catch (...) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  ::close(fd);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    throw DataError(
        fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message()));
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
  if (length > file_size - 8) {
    throw DataError(fmt::format("{}: header length {} exceeds the file ({} bytes)", path.string(),
                                length, file_size));
  }
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
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
      const std::uint64_t bytes = static_cast<std::uint64_t>(shape_numel(shape)) * 4;
      if (offsets.size() != 2 || offsets[1] < offsets[0] || offsets[1] > data_size ||
          offsets[1] - offsets[0] != bytes) {
        throw DataError(
            fmt::format("{}: tensor {} has data offsets outside the file or not "
                        "matching its shape (file truncated?)",
                        path.string(), name));
      }
      out.entries.emplace(name, SafetensorsEntry{.dtype = tag == "F32" ? DType::f32 : DType::i32,
                                                 .shape = shape,
                                                 .offset = 8 + length + offsets[0]});
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: malformed entry for {}: {}", path.string(), name, e.what()));
    }
  }
  return out;
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
  char* data =
      e.dtype == DType::f32 ? reinterpret_cast<char*>(t.f32()) : reinterpret_cast<char*>(t.i32());
  in.read(data, static_cast<std::streamsize>(t.bytes()));
  if (!in) throw DataError(fmt::format("{}: read of {} failed", index.path.string(), name));
  return t;
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  SafetensorsIndex index = read_safetensors_index(path);
  SafetensorsFile out;
  for (const auto& [name, entry] : index.entries) {
    out.tensors.emplace(name, read_safetensors_tensor(index, name));
  }
  out.metadata = std::move(index.metadata);
  return out;
}

}  // namespace meshtrain
