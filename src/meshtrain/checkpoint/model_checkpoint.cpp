#include "meshtrain/checkpoint/model_checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"

namespace meshtrain {
namespace {

void write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  StagedFile(path, std::as_bytes(std::span<const char>(text))).commit();
}

}  // namespace

void save_model_checkpoint(const std::filesystem::path& dir,
                           const std::vector<NamedTensor>& tensors, const Config& config,
                           const std::filesystem::path& meta_json) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw DataError(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  write_safetensors(dir / "model.safetensors", tensors, {{"format", "meshtrain-model-v1"}});
  write_text_atomically(dir / "config.toml", to_toml(config));
  if (meta_json.empty()) return;
  std::ifstream meta(meta_json, std::ios::binary);
  if (!meta) throw DataError(fmt::format("cannot read {}", meta_json.string()));
  write_text_atomically(dir / "meta.json", std::string(std::istreambuf_iterator<char>(meta), {}));
}

void load_model_parameters(const std::filesystem::path& dir, const ParameterList& params) {
  const SafetensorsFile file = read_safetensors(dir / "model.safetensors");
  for (Parameter* p : params) {
    const auto it = file.tensors.find(p->name);
    if (it == file.tensors.end()) {
      throw DataError(fmt::format("{}: parameter {} is missing",
                                  (dir / "model.safetensors").string(), p->name));
    }
    if (it->second.shape() != p->value.shape() || it->second.dtype() != DType::f32) {
      throw DataError(fmt::format("{}: parameter {} has shape {}, the model expects {}",
                                  (dir / "model.safetensors").string(), p->name,
                                  to_string(it->second.shape()), to_string(p->value.shape())));
    }
    for (const float v : it->second.span_f32()) {
      if (!std::isfinite(v)) {
        throw DataError(
            fmt::format("{}: parameter {} holds a non-finite value (nan or inf); the "
                        "checkpoint is corrupt or the run diverged",
                        (dir / "model.safetensors").string(), p->name));
      }
    }
    p->value.copy_from(it->second);
  }
}

}  // namespace meshtrain
