#include "meshtrain/checkpoint/hf_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

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

// The first non-finite element's index, or -1.
std::int64_t first_non_finite(const Tensor& t) {
  const std::span<const float> v = t.span_f32();
  const auto it = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
  return it == v.end() ? -1 : static_cast<std::int64_t>(it - v.begin());
}

constexpr std::string_view kExpertsInfix = ".block_sparse_moe.experts.";

// Experts per MoE block in a file's tensor names (1 + the largest j of
// "….block_sparse_moe.experts.{j}.…"); 0 when the file has none (a dense model).
std::int64_t experts_in_file(const SafetensorsIndex& index) {
  std::int64_t experts = 0;
  for (const auto& [name, entry] : index.entries) {
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

// What stops `model` from being a Hugging Face model (Mixtral has a sparse MoE block in every
// layer, so a model with MoE only every n-th layer has no Hugging Face class).
std::vector<ConfigIssue> hf_export_issues(const ModelConfig& m) {
  if (m.moe_experts == 0 || m.moe_layer_freq == 1) return {};
  return {{"model.moe_layer_freq", std::to_string(m.moe_layer_freq),
           "Hugging Face's Mixtral (MixtralForCausalLM) has a sparse MoE block in every layer "
           "and no layer frequency, so a model with MoE every n-th layer cannot be exported",
           "export models trained with model.moe_layer_freq = 1, or keep this one in meshtrain's "
           "own checkpoint format"}};
}

}  // namespace

Shape HfTensor::hf_shape() const {
  if (!transposed) return shape;
  return {shape[1], shape[0]};
}

std::vector<HfTensor> hf_tensors(const ModelConfig& model) {
  // The model's own parameter table (names, logical shapes) from a storage-free tp = 1 build.
  const auto self = single_rank_group("tp");
  const DeferParameterStorage defer;
  const CausalLm lm(model, 0, TensorParallel{*self});
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

std::string hf_config_json(const ModelConfig& m) {
  if (std::vector<ConfigIssue> issues = hf_export_issues(m); !issues.empty()) {
    throw ConfigError("the model to export", std::move(issues));
  }
  nlohmann::ordered_json j;
  if (m.family == ModelFamily::llama && m.moe_experts > 0) {
    // transformers 4.36.2's MixtralConfig names. Mixtral's head_dim is n_embd / n_head (no key
    // for it), its attention and experts have no bias, and its router is dropless top-k with
    // renormalised weights (docs/moe.md): meshtrain's capacity factor, drop policy and z-loss
    // are training settings with no counterpart.
    j = {{"architectures", {"MixtralForCausalLM"}},
         {"model_type", "mixtral"},
         {"vocab_size", m.vocab_size},
         {"hidden_size", m.n_embd},
         {"intermediate_size", moe_ffn_hidden_of(m)},
         {"num_hidden_layers", m.n_layer},
         {"num_attention_heads", m.n_head},
         {"num_key_value_heads", kv_heads_of(m)},
         {"max_position_embeddings", m.block_size},
         {"hidden_act", "silu"},
         {"rms_norm_eps", m.norm_eps},
         {"rope_theta", m.rope_theta},
         {"sliding_window", nullptr},
         {"attention_dropout", 0.0},
         {"num_local_experts", m.moe_experts},
         {"num_experts_per_tok", m.moe_top_k},
         {"router_aux_loss_coef", m.moe_aux_loss_coeff},
         {"output_router_logits", false},
         {"tie_word_embeddings", false},
         {"torch_dtype", "float32"}};
  } else if (m.family == ModelFamily::llama) {
    j = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"vocab_size", m.vocab_size},
         {"hidden_size", m.n_embd},
         {"intermediate_size", ffn_hidden_of(m)},
         {"num_hidden_layers", m.n_layer},
         {"num_attention_heads", m.n_head},
         {"num_key_value_heads", kv_heads_of(m)},
         {"head_dim", m.n_embd / m.n_head},
         {"max_position_embeddings", m.block_size},
         {"hidden_act", "silu"},
         {"rms_norm_eps", m.norm_eps},
         {"rope_theta", m.rope_theta},
         {"attention_bias", false},
         {"mlp_bias", false},
         {"tie_word_embeddings", false},
         {"torch_dtype", "float32"}};
  } else {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", m.vocab_size},
         {"n_positions", m.block_size},
         {"n_ctx", m.block_size},
         {"n_embd", m.n_embd},
         {"n_layer", m.n_layer},
         {"n_head", m.n_head},
         {"n_inner", ffn_hidden_of(m)},
         {"activation_function", "gelu_new"},  // GELU, tanh approximation
         {"layer_norm_epsilon", m.norm_eps},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"scale_attn_weights", true},
         {"tie_word_embeddings", true},
         {"torch_dtype", "float32"}};
  }
  j["meshtrain_note"] = "written by meshtrain export; tokenizer: the run's meta.json";
  return j.dump(2) + "\n";
}

void export_hf(const std::vector<NamedTensor>& logical, const Config& config, const fs::path& out) {
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
    if (const std::int64_t i = first_non_finite(t); i >= 0) {
      throw DataError(fmt::format(
          "export: parameter {} holds a non-finite value (element {}): the run diverged or the "
          "checkpoint is corrupt; nothing was written",
          spec.name, i));
    }
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
  const std::string json = hf_config_json(config.model);
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
  for (auto& [name, tensor] : file.tensors) model.tensors.push_back({name, std::move(tensor)});
  return model;
}

HfImport::HfImport(const fs::path& path, const ModelConfig& model)
    : index_(read_safetensors_index(path)), specs_(hf_tensors(model)) {
  const std::string file = path.string();
  if (const auto f = index_.metadata.find("format");
      f != index_.metadata.end() && f->second == "meshtrain-model-v1") {
    throw DataError(fmt::format(
        "{} is a meshtrain final checkpoint (meshtrain layout), not a Hugging Face file; "
        "convert it first: meshtrain export {} model.safetensors",
        file, path.parent_path().string()));
  }
  const bool gpt2 = model.family == ModelFamily::gpt2;
  // The original GPT-2 files name tensors without "transformer.".
  const bool short_names = gpt2 && !index_.entries.contains("transformer.wte.weight") &&
                           index_.entries.contains("wte.weight");
  std::vector<std::string> problems;
  const bool gpt2_file =
      index_.entries.contains("transformer.wte.weight") || index_.entries.contains("wte.weight");
  const bool llama_file = index_.entries.contains("model.embed_tokens.weight");
  if ((gpt2 && llama_file) || (!gpt2 && gpt2_file)) {
    problems.push_back(fmt::format("the file holds a {} model, the config says model.family = {}",
                                   gpt2_file ? "gpt2" : "llama", to_string(model.family)));
  }
  if (const std::int64_t experts = experts_in_file(index_); experts != model.moe_experts) {
    problems.push_back(
        experts == 0 ? fmt::format("the file holds a dense model, the config says "
                                   "model.moe_experts = {} (a MoE model)",
                                   model.moe_experts)
                     : fmt::format("the file holds a Mixtral-style MoE model with {} experts per "
                                   "layer, the config says model.moe_experts = {}{}",
                                   experts, model.moe_experts,
                                   model.moe_experts == 0 ? " (a dense model)" : ""));
  } else if (experts > 0 && model.moe_layer_freq != 1 && model.n_layer > 1 &&
             index_.entries.contains("model.layers.1.block_sparse_moe.gate.weight")) {
    problems.push_back(fmt::format(
        "the file has MoE blocks where the config (model.moe_layer_freq = {}) has dense MLPs "
        "(a Mixtral file has one in every layer)",
        model.moe_layer_freq));
  }
  std::set<std::string> expected;
  for (const HfTensor& spec : specs_) {
    std::string stored = spec.hf_name;
    if (short_names && stored.starts_with(kGpt2Prefix)) stored = stored.substr(kGpt2Prefix.size());
    expected.insert(stored);
    const auto it = index_.entries.find(stored);
    if (it == index_.entries.end()) {
      if (!spec.name.empty()) problems.push_back(fmt::format("tensor {} is missing", stored));
      continue;
    }
    if (it->second.dtype != DType::f32 || it->second.shape != spec.hf_shape()) {
      problems.push_back(fmt::format(
          "tensor {} has shape {}{} in the file; the model expects {} F32 (Hugging Face layout{})",
          stored, to_string(it->second.shape), it->second.dtype == DType::f32 ? "" : " I32",
          to_string(spec.hf_shape()),
          spec.transposed ? fmt::format(", [in, out] of meshtrain's {}", to_string(spec.shape))
                          : ""));
      continue;
    }
    file_name_.emplace(spec.hf_name, stored);
  }
  for (const auto& [name, entry] : index_.entries) {
    if (expected.contains(name) || is_hf_buffer(name)) continue;
    if (gpt2 && name == "lm_head.weight") continue;  // tied to wte: HF itself ignores it
    problems.push_back(
        fmt::format("tensor {} ({}) has no place in the model", name, to_string(entry.shape)));
  }
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
        "of the model that was exported (its config.json), or use that model's file",
        file, describe(model), problems.size(), list));
  }
}

void HfImport::check_values() const {
  for (const HfTensor& spec : specs_) {
    const auto it = file_name_.find(spec.hf_name);
    if (it == file_name_.end()) continue;  // an absent zero bias
    const Tensor t = read_safetensors_tensor(index_, it->second);
    if (const std::int64_t i = first_non_finite(t); i >= 0) {
      throw DataError(fmt::format("{}: tensor {} holds a non-finite value (element {})",
                                  index_.path.string(), it->second, i));
    }
    if (spec.name.empty()) {
      const std::span<const float> v = t.span_f32();
      if (std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; })) {
        throw DataError(fmt::format(
            "{}: tensor {} holds non-zero values, but the model has model.bias = false; set "
            "model.bias = true to use them",
            index_.path.string(), it->second));
      }
    }
  }
}

Tensor HfImport::logical(const HfTensor& spec) const {
  return from_hf(read_safetensors_tensor(index_, file_name_.at(spec.hf_name)), spec);
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
