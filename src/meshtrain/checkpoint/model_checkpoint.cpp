#include "meshtrain/checkpoint/model_checkpoint.h"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/checkpoint/finite_values.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/file_name.h"
#include "meshtrain/core/staged_file.h"

namespace meshtrain {
namespace {

void write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  StagedFile(path, std::as_bytes(std::span<const char>(text))).commit();
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("cannot read {}", path.string()));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// meta.json's "tokenizer": {"files": [...]} (format v2, data/metadata.h; v1 and char have
// none). data/ is not a dependency of checkpoint/, so the one field is read here; names
// that are not plain file names are refused, so a hostile meta.json copies nothing from
// outside its directory.
std::vector<std::string> tokenizer_file_names(const std::string& meta,
                                              const std::filesystem::path& meta_json) {
  const nlohmann::json doc = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  const auto tokenizer = doc.is_object() ? doc.find("tokenizer") : doc.end();
  if (!doc.is_object() || tokenizer == doc.end() || !tokenizer->is_object() ||
      !tokenizer->contains("files")) {
    return {};
  }
  std::vector<std::string> names;
  for (const nlohmann::json& entry : (*tokenizer)["files"]) {
    const std::string name = entry.is_string() ? entry.get<std::string>() : "";
    if (!is_plain_file_name(name)) {
      throw DataError(fmt::format("{} names tokenizer file {}, expected a plain file name",
                                  meta_json.string(), entry.dump()));
    }
    names.push_back(name);
  }
  return names;
}

}  // namespace

void save_model_checkpoint(const std::filesystem::path& dir,
                           const std::vector<NamedTensor>& tensors, const Config& config,
                           const std::filesystem::path& meta_json) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw DataError(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  write_safetensors(dir / "model.safetensors", tensors, {{"format", "meshtrain-model-v1"}});
  write_text_atomically(dir / "config.toml", checkpoint_toml(config));
  if (meta_json.empty()) return;
  const std::string meta = read_text(meta_json);
  // The tokenizer's files first, so a checkpoint's meta.json never names a missing file.
  for (const std::string& name : tokenizer_file_names(meta, meta_json)) {
    write_text_atomically(dir / name, read_text(meta_json.parent_path() / name));
  }
  write_text_atomically(dir / "meta.json", meta);
}

void load_model_parameters(const std::vector<NamedTensor>& logical, std::string_view source,
                           const ParameterList& params) {
  std::map<std::string_view, const Tensor*> by_name;
  for (const NamedTensor& t : logical) by_name.emplace(t.name, &t.tensor);
  for (Parameter* p : params) {
    const auto it = by_name.find(p->name);
    if (it == by_name.end()) {
      throw DataError(fmt::format("{}: parameter {} is missing", source, p->name));
    }
    const Tensor& t = *it->second;
    if (t.shape() != p->shard.logical_shape || t.dtype() != DType::f32) {
      throw DataError(fmt::format("{}: parameter {} has shape {}, the model expects {}", source,
                                  p->name, to_string(t.shape()),
                                  to_string(p->shard.logical_shape)));
    }
    require_finite(t.span_f32(), source, p->name);
    copy_range_from_logical(*p, t, 0, p->value.numel(), p->value.f32());
  }
}

}  // namespace meshtrain
