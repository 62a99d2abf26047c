#include "meshtrain/checkpoint/hf_weights.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "meshtrain/core/error.h"
#include "meshtrain/core/file_name.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSingleFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
// An index of the largest public models is well under 1 MB; anything near this is not one.
constexpr std::uintmax_t kMaxIndexBytes = 100'000'000;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The index's weight_map: tensor → shard file name, each name checked.
std::map<std::string, std::string> read_weight_map(const fs::path& index) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(index, ec);
  if (ec) throw DataError(fmt::format("{}: cannot open (missing or unreadable)", index.string()));
  if (size > kMaxIndexBytes) {
    throw DataError(fmt::format("{}: {} bytes, more than any safetensors index ({} at most)",
                                index.string(), size, kMaxIndexBytes));
  }
  const std::vector<std::byte> bytes = read_file_bytes(index);
  const nlohmann::json j =
      nlohmann::json::parse(reinterpret_cast<const char*>(bytes.data()),
                            reinterpret_cast<const char*>(bytes.data()) + bytes.size(), nullptr,
                            /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object()) {
    throw DataError(fmt::format(
        "{}: not a safetensors index (JSON with a \"weight_map\" object of tensor → shard file, "
        "as transformers' save_pretrained writes)",
        index.string()));
  }
  std::map<std::string, std::string> out;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) {
      throw DataError(fmt::format("{}: weight_map[\"{}\"] is {}, not a file name", index.string(),
                                  tensor, shard.dump()));
    }
    const std::string name = shard.get<std::string>();
    if (!is_plain_file_name(name)) {
      throw DataError(fmt::format(
          "{}: weight_map[\"{}\"] names the shard \"{}\", which is not a file name in the "
          "index's directory; the shards of a sharded model lie beside its index (no \"/\", "
          "\"..\" or absolute paths)",
          index.string(), tensor, name));
    }
    out.emplace(tensor, name);
  }
  if (out.empty()) throw DataError(fmt::format("{}: the weight_map is empty", index.string()));
  return out;
}

HfWeights open_single(const fs::path& source, const fs::path& file) {
  HfWeights w;
  w.source = source;
  w.dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  w.files.push_back(read_safetensors_index(file));
  for (const auto& [name, entry] : w.files[0].entries)
    w.tensors.emplace(name, HfWeights::Located{0, entry});
  w.metadata = w.files[0].metadata;
  return w;
}

HfWeights open_sharded(const fs::path& source, const fs::path& index) {
  HfWeights w;
  w.source = source;
  w.dir = index.has_parent_path() ? index.parent_path() : fs::path(".");
  const std::map<std::string, std::string> weight_map = read_weight_map(index);
  std::map<std::string, std::size_t> file_of_shard;
  for (const auto& [tensor, shard] : weight_map) {
    if (file_of_shard.contains(shard)) continue;
    file_of_shard.emplace(shard, w.files.size());
    w.files.push_back(read_safetensors_index(w.dir / shard));
  }
  for (const auto& [shard, i] : file_of_shard) {
    for (const auto& [tensor, entry] : w.files[i].entries) {
      const auto it = weight_map.find(tensor);
      if (it == weight_map.end() || it->second != shard) {
        throw DataError(fmt::format(
            "{}: shard {} holds tensor {}, which the index {}; the index and its shards "
            "disagree (re-save the model, or fix the index)",
            index.string(), shard, tensor,
            it == weight_map.end() ? "does not list" : "maps to " + it->second));
      }
      w.tensors.emplace(tensor, HfWeights::Located{i, entry});
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    if (!w.tensors.contains(tensor)) {
      throw DataError(fmt::format("{}: the index maps tensor {} to shard {}, which lacks it",
                                  index.string(), tensor, shard));
    }
  }
  w.metadata = w.files.front().metadata;
  return w;
}

}  // namespace

const fs::path& HfWeights::file_of(const std::string& tensor) const {
  const auto it = tensors.find(tensor);
  MT_CHECK(it != tensors.end(), "{}: no tensor {}", name(), tensor);
  return files[it->second.file].path;
}

HfWeights open_hf_weights(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / kSingleFile, ec)) return open_single(path, path / kSingleFile);
    if (fs::exists(path / kIndexFile, ec)) return open_sharded(path, path / kIndexFile);
    throw DataError(fmt::format(
        "{}: the directory holds neither {} nor {} (a Hugging Face model directory holds one)",
        path.string(), kSingleFile, kIndexFile));
  }
  if (!fs::exists(path, ec)) {
    throw DataError(fmt::format("{}: cannot open (no such file or directory)", path.string()));
  }
  if (ends_with(path.string(), ".json")) return open_sharded(path, path);
  return open_single(path, path);
}

Tensor read_hf_tensor_f32(const HfWeights& weights, const std::string& name) {
  const auto it = weights.tensors.find(name);
  if (it == weights.tensors.end()) {
    throw DataError(fmt::format("{}: no tensor {}", weights.name(), name));
  }
  const SafetensorsIndex& file = weights.files[it->second.file];
  if (it->second.entry.dtype == DType::i32) {
    throw DataError(
        fmt::format("{}: tensor {} is I32, not a floating-point weight", file.path.string(), name));
  }
  Tensor stored = read_safetensors_tensor(file, name);
  if (stored.dtype() == DType::f32) return stored;
  return stored.to(DType::f32, MemCategory::other);
}

}  // namespace meshtrain
