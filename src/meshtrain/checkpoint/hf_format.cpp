#include "meshtrain/checkpoint/hf_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "meshtrain/checkpoint/finite_values.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/model/causal_lm.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kGpt2Prefix = "transformer.";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// HF GPT-2's Conv1D weights: stored [in, out].
bool is_conv1d_weight(std::string_view name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

// Tensors of HF files that are not parameters (causal-mask and RoPE buffers older
// transformers versions saved), skipped on import.
bool is_hf_buffer(std::string_view name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
         ends_with(name, ".rotary_emb.inv_freq");
}

std::string describe(const ModelConfig& m) {
  std::string out =
      fmt::format("family {}, n_layer {}, n_head {}, n_embd {}, vocab_size {}, block_size {}",
                  to_string(m.family), m.n_layer, m.n_head, m.n_embd, m.vocab_size, m.block_size);
  if (m.moe_experts > 0) {
    out += fmt::format(", moe_experts {} (top {}, F {})", m.moe_experts, m.moe_top_k,
                       moe_ffn_hidden_of(m));
  }
  return out;
}

Tensor transpose_2d(const Tensor& t) {
  const std::int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out = Tensor::empty({cols, rows}, MemCategory::other);
  const float* src = t.f32();
  float* dst = out.f32();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
  return out;
}

constexpr std::string_view kExpertsInfix = ".block_sparse_moe.experts.";

// Experts per MoE block in a file's tensor names (1 + the largest j of
// "….block_sparse_moe.experts.{j}.…"); 0 when the file has none (a dense model).
std::int64_t experts_in_file(const std::map<std::string, HfWeights::Located>& tensors) {
  std::int64_t experts = 0;
  for (const auto& [name, located] : tensors) {
    const std::size_t at = name.find(kExpertsInfix);
    if (at == std::string::npos) continue;
    const std::size_t first = at + kExpertsInfix.size();
    const std::size_t dot = name.find('.', first);
    const std::string digits = name.substr(first, dot - first);
    const bool number = !digits.empty() && digits.size() <= 9 &&
                        std::all_of(digits.begin(), digits.end(),
                                    [](unsigned char c) { return std::isdigit(c) != 0; });
    if (!number) continue;
    experts = std::max<std::int64_t>(experts, std::stoll(digits) + 1);
  }
  return experts;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
  }
  return "?";
}

// The file's family and MoE structure against the model's, named before any tensor.
std::vector<std::string> model_kind_problems(
    const std::map<std::string, HfWeights::Located>& in_file, const ModelConfig& model) {
  std::vector<std::string> problems;
  const bool gpt2 = model.family == ModelFamily::gpt2;
  const bool gpt2_file =
      in_file.contains("transformer.wte.weight") || in_file.contains("wte.weight");
  const bool llama_file = in_file.contains("model.embed_tokens.weight");
  if ((gpt2 && llama_file) || (!gpt2 && gpt2_file)) {
    problems.push_back(fmt::format("the file holds a {} model, the config says model.family = {}",
                                   gpt2_file ? "gpt2" : "llama", to_string(model.family)));
  }
  if (const std::int64_t experts = experts_in_file(in_file); experts != model.moe_experts) {
    problems.push_back(
        experts == 0 ? fmt::format("the file holds a dense model, the config says "
                                   "model.moe_experts = {} (a MoE model)",
                                   model.moe_experts)
                     : fmt::format("the file holds a Mixtral-style MoE model with {} experts per "
                                   "layer, the config says model.moe_experts = {}{}",
                                   experts, model.moe_experts,
                                   model.moe_experts == 0 ? " (a dense model)" : ""));
  } else if (experts > 0 && model.moe_layer_freq != 1 && model.n_layer > 1 &&
             in_file.contains("model.layers.1.block_sparse_moe.gate.weight")) {
    problems.push_back(fmt::format(
        "the file has MoE blocks where the config (model.moe_layer_freq = {}) has dense MLPs "
        "(a Mixtral file has one in every layer)",
        model.moe_layer_freq));
  }
  return problems;
}

}  // namespace

Shape HfTensor::hf_shape() const {
  if (!transposed) return shape;
  return {shape[1], shape[0]};
}

std::vector<HfTensor> hf_tensors(const ModelConfig& model) {
  // The model's own parameter table (names, logical shapes) from a storage-free tp = 1 build.
  const auto self = single_rank_group("tp");
  const CausalLm lm(model, 0, TensorParallel{*self}, RecomputeMode::none,
                    ParameterStorage::deferred);
  const bool gpt2 = model.family == ModelFamily::gpt2;
  std::vector<HfTensor> out;
  for (const Parameter* p : lm.parameters()) {
    const bool transposed = gpt2 && is_conv1d_weight(p->name);
    out.push_back({.hf_name = p->name,
                   .name = p->name,
                   .shape = p->shard.logical_shape,
                   .transposed = transposed});
    // HF GPT-2 has a bias beside every LayerNorm and Conv1D weight: zero for a bias-free model.
    const bool has_bias_slot = gpt2 && ends_with(p->name, ".weight") &&
                               p->name != "transformer.wte.weight" &&
                               p->name != "transformer.wpe.weight";
    if (has_bias_slot && !model.bias) {
      const std::string bias = p->name.substr(0, p->name.size() - 6) + "bias";
      out.push_back(
          {.hf_name = bias, .name = "", .shape = {p->shard.logical_shape[0]}, .transposed = false});
    }
  }
  return out;
}

Tensor to_hf(const Tensor& logical, const HfTensor& spec) {
  MT_CHECK(logical.shape() == spec.shape && logical.dtype() == DType::f32,
           "{}: tensor of shape {}, expected {}", spec.hf_name, to_string(logical.shape()),
           to_string(spec.shape));
  return spec.transposed ? transpose_2d(logical) : logical.clone(MemCategory::other);
}

Tensor from_hf(const Tensor& stored, const HfTensor& spec) {
  MT_CHECK(stored.shape() == spec.hf_shape() && stored.dtype() == DType::f32,
           "{}: tensor of shape {}, expected {}", spec.hf_name, to_string(stored.shape()),
           to_string(spec.hf_shape()));
  return spec.transposed ? transpose_2d(stored) : stored.clone(MemCategory::other);
}

void export_hf(const std::vector<NamedTensor>& logical, const Config& config, const fs::path& out,
               const HfTokenIds& ids) {
  if (config.model.vocab_size <= 0) {
    throw DataError(fmt::format("export: model.vocab_size is {}; pass the run's resolved config",
                                config.model.vocab_size));
  }
  if (std::vector<ConfigIssue> issues = hf_export_issues(config.model); !issues.empty()) {
    throw ConfigError(config.source, std::move(issues));
  }
  const std::vector<HfTensor> specs = hf_tensors(config.model);
  std::map<std::string, const Tensor*> by_name;
  for (const NamedTensor& t : logical) by_name.emplace(t.name, &t.tensor);
  std::set<std::string> used;
  std::vector<NamedTensor> tensors;
  for (const HfTensor& spec : specs) {
    if (spec.name.empty()) {  // a zero bias of a bias-free gpt2
      tensors.push_back({spec.hf_name, Tensor::zeros(spec.shape, MemCategory::other)});
      continue;
    }
    const auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      throw DataError(fmt::format("export: the model ({}) has a parameter {} that the source lacks",
                                  describe(config.model), spec.name));
    }
    const Tensor& t = *it->second;
    if (t.dtype() != DType::f32 || t.shape() != spec.shape) {
      throw DataError(fmt::format("export: parameter {} has shape {}, the model ({}) expects {}",
                                  spec.name, to_string(t.shape()), describe(config.model),
                                  to_string(spec.shape)));
    }
    require_finite(t.span_f32(), "export", spec.name,
                   "the run diverged or the checkpoint is corrupt; nothing was written");
    used.insert(spec.name);
    tensors.push_back({spec.hf_name, to_hf(t, spec)});
  }
  for (const NamedTensor& t : logical) {
    if (!used.contains(t.name)) {
      throw DataError(fmt::format("export: tensor {} is not a parameter of the model ({})", t.name,
                                  describe(config.model)));
    }
  }
  write_safetensors(out, tensors, {{"format", "pt"}, {"meshtrain_format", "hf-export-v1"}});
  const std::string json = hf_config_json(config.model, ids);
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  StagedFile(dir / "config.json", std::as_bytes(std::span<const char>(json))).commit();
}

LogicalModel load_logical_model(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw DataError(fmt::format("{}: no such checkpoint directory", dir.string()));
  }
  if (fs::exists(dir / "metadata.json", ec)) {  // a sharded checkpoint: assemble each tensor
    CheckpointReader reader(dir);
    LogicalModel model;
    model.config = reader.config();
    for (const std::string& name : reader.tensor_names()) {
      model.tensors.push_back({name, reader.read_logical(name)});
    }
    return model;
  }
  if (!fs::exists(dir / "config.toml", ec) || !fs::exists(dir / "model.safetensors", ec)) {
    throw DataError(
        fmt::format("{} is not a meshtrain checkpoint (it needs config.toml and "
                    "model.safetensors, or metadata.json and COMPLETE); pass the checkpoint.dir "
                    "of a finished run or a checkpoints/step-N directory",
                    dir.string()));
  }
  LogicalModel model;
  model.config = load_config_file(dir / "config.toml");
  if (model.config.model.vocab_size <= 0) {
    throw DataError(
        fmt::format("{}: model.vocab_size is {}; a finished run records the resolved "
                    "vocabulary size",
                    (dir / "config.toml").string(), model.config.model.vocab_size));
  }
  SafetensorsFile file = read_safetensors(dir / "model.safetensors");
  for (auto& [name, tensor] : file.tensors) {
    if (tensor.dtype() == DType::f32) {
      require_finite(tensor.span_f32(), (dir / "model.safetensors").string(), name);
    }
    model.tensors.push_back({name, std::move(tensor)});
  }
  return model;
}

HfImport::HfImport(const fs::path& path, const ModelConfig& model)
    : weights_(open_hf_weights(path)), specs_(hf_tensors(model)) {
  if (const auto f = weights_.metadata.find("format");
      f != weights_.metadata.end() && f->second == "meshtrain-model-v1") {
    throw DataError(fmt::format(
        "{} is a meshtrain final checkpoint (meshtrain layout), not a Hugging Face file; "
        "convert it first: meshtrain export {} model.safetensors",
        weights_.name(), weights_.dir.string()));
  }
  std::vector<std::string> problems = model_kind_problems(weights_.tensors, model);
  bool tied_head = model.family == ModelFamily::gpt2;
  std::error_code ec;
  if (fs::exists(weights_.dir / "config.json", ec)) {
    HfConfigCheck check = check_hf_config(weights_.dir / "config.json", model);
    tied_head = check.tied_head;
    for (std::string& p : check.problems) problems.push_back(std::move(p));
    config_checked_ = true;
  }
  match_tensors(model, tied_head, problems);
  if (!problems.empty()) {
    constexpr std::size_t kShown = 8;
    std::string list;
    for (std::size_t i = 0; i < std::min(problems.size(), kShown); ++i) {
      list += "\n  " + problems[i];
    }
    if (problems.size() > kShown)
      list += fmt::format("\n  … and {} more", problems.size() - kShown);
    throw DataError(fmt::format(
        "{} does not fit the model ({}): {} problem(s){}\n  fix: set the model.* keys to those "
        "of the model in the file (its config.json), or use that model's file",
        weights_.name(), describe(model), problems.size(), list));
  }
}

void HfImport::match_tensors(const ModelConfig& model, bool tied_head,
                             std::vector<std::string>& problems) {
  const auto& in_file = weights_.tensors;
  const bool gpt2 = model.family == ModelFamily::gpt2;
  // The original GPT-2 files name tensors without "transformer.".
  const bool short_names =
      gpt2 && !in_file.contains("transformer.wte.weight") && in_file.contains("wte.weight");
  std::set<std::string> expected;
  for (const HfTensor& spec : specs_) {
    std::string stored = spec.hf_name;
    if (short_names && stored.starts_with(kGpt2Prefix)) stored = stored.substr(kGpt2Prefix.size());
    // A Llama saved with tie_word_embeddings = true has no lm_head.weight: its head is the
    // embedding, which then starts meshtrain's untied head.
    if (!gpt2 && stored == "lm_head.weight" && !in_file.contains(stored) && tied_head) {
      stored = "model.embed_tokens.weight";
      head_from_embedding_ = true;
    }
    expected.insert(stored);
    const auto it = in_file.find(stored);
    if (it == in_file.end()) {
      if (spec.name.empty()) continue;  // a zero bias of a bias-free gpt2 may be absent
      problems.push_back(
          stored == "lm_head.weight"
              ? std::string("tensor lm_head.weight is missing (a Llama saved with "
                            "tie_word_embeddings = true omits it: put its config.json beside "
                            "the file to start the head from the embedding)")
              : fmt::format("tensor {} is missing", stored));
      continue;
    }
    const SafetensorsEntry& e = it->second.entry;
    if (e.dtype == DType::i32 || e.shape != spec.hf_shape()) {
      problems.push_back(fmt::format(
          "tensor {} has shape {} in the file; the model expects {} (the file's is {}; F32, "
          "BF16 or F16 are read; Hugging Face layout{})",
          stored, to_string(e.shape), to_string(spec.hf_shape()), dtype_name(e.dtype),
          spec.transposed ? fmt::format(", [in, out] of meshtrain's {}", to_string(spec.shape))
                          : ""));
      continue;
    }
    dtypes_.insert(dtype_name(e.dtype));
    file_name_.emplace(spec.hf_name, stored);
  }
  for (const auto& [name, located] : in_file) {
    if (expected.contains(name)) continue;
    if (is_hf_buffer(name)) {  // a causal mask or RoPE table: recomputed, not a parameter
      ++ignored_buffers_;
      continue;
    }
    if (gpt2 && name == "lm_head.weight") continue;  // tied to wte: HF itself ignores it
    problems.push_back(fmt::format(
        "tensor {} ({} {}, in {}) has no place in the model: neither a parameter nor one of "
        "Hugging Face's known buffers (attn.bias, attn.masked_bias, rotary_emb.inv_freq)",
        name, dtype_name(located.entry.dtype), to_string(located.entry.shape),
        weights_.file_of(name).filename().string()));
  }
}

std::string HfImport::summary() const {
  std::string dtypes;
  for (const std::string& d : dtypes_) dtypes += (dtypes.empty() ? "" : "+") + d;
  std::string out = fmt::format("{} tensors, {}{}", file_name_.size(), dtypes,
                                dtypes == "F32" ? "" : " widened to f32");
  if (weights_.files.size() > 1) out += fmt::format(", {} shards", weights_.files.size());
  if (ignored_buffers_ > 0)
    out += fmt::format(", {} non-parameter buffers ignored", ignored_buffers_);
  if (head_from_embedding_) out += ", lm_head.weight from model.embed_tokens.weight (tied)";
  out += config_checked_ ? ", config.json agrees" : ", no config.json to check";
  return out;
}

void HfImport::check_values() const {
  for (const HfTensor& spec : specs_) {
    const auto it = file_name_.find(spec.hf_name);
    if (it == file_name_.end()) continue;  // an absent zero bias
    const Tensor t = read_hf_tensor_f32(weights_, it->second);
    const std::string file = weights_.file_of(it->second).string();
    require_finite(t.span_f32(), file, it->second,
                   "the file is corrupt or its model diverged; use another file");
    if (spec.name.empty()) {
      const std::span<const float> v = t.span_f32();
      if (std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; })) {
        throw DataError(fmt::format(
            "{}: tensor {} holds non-zero values, but the model has model.bias = false; set "
            "model.bias = true to use them",
            file, it->second));
      }
    }
  }
}

Tensor HfImport::logical(const HfTensor& spec) const {
  return from_hf(read_hf_tensor_f32(weights_, file_name_.at(spec.hf_name)), spec);
}

void HfImport::fill(const Parameter& p, std::int64_t begin, std::int64_t end, float* out) {
  if (cached_name_ != p.name) {
    const auto it = std::find_if(specs_.begin(), specs_.end(),
                                 [&](const HfTensor& s) { return s.name == p.name; });
    MT_CHECK(it != specs_.end(), "{} is not a parameter of the imported model", p.name);
    // Called between collectives: a read that fails now (the file changed after it was checked)
    // must stop every rank, not leave the others waiting.
    try {
      cached_ = logical(*it);
    } catch (const DataError& e) {
      MT_CHECK(false, "reading {} failed after it was validated: {}", p.name, e.what());
    }
    cached_name_ = p.name;
  }
  copy_range_from_logical(p, cached_, begin, end, out);
}

}  // namespace meshtrain
