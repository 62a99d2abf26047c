#include "meshtrain/checkpoint/hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "meshtrain/config/validate.h"

namespace meshtrain {
namespace {

using nlohmann::json;

constexpr std::uintmax_t kMaxConfigBytes = 1'000'000;

// Collects the disagreements of one config.json with the run's model.
class Comparer {
 public:
  explicit Comparer(const json& j) : j_(j) {}

  // An integer key (absent: `fallback`, or not compared when none) against a model.* setting.
  void integer(const char* key, std::int64_t want, const char* setting,
               std::optional<std::int64_t> fallback = std::nullopt) {
    const std::optional<std::int64_t> got = get_int(key, fallback);
    if (got && *got != want) differ(key, std::to_string(*got), setting, std::to_string(want));
  }
  // A number within relative 1e-6 (config.json writes floats in decimal).
  void number(const char* key, double want, const char* setting, double fallback) {
    const json* v = find(key);
    if (v != nullptr && !v->is_number()) return wrong_type(key, "a number");
    const double got = v == nullptr ? fallback : v->get<double>();
    if (std::abs(got - want) > 1e-6 * std::max(std::abs(want), 1e-30)) {
      differ(key, fmt::format("{}", got), setting, fmt::format("{}", want));
    }
  }
  // A string key that must be one of `allowed` (absent: `fallback`).
  void one_of(const char* key, std::initializer_list<const char*> allowed, const char* fallback,
              const std::string& why) {
    const json* v = find(key);
    if (v != nullptr && !v->is_string()) return wrong_type(key, "a string");
    const std::string got = v == nullptr ? fallback : v->get<std::string>();
    for (const char* a : allowed) {
      if (got == a) return;
    }
    problems.push_back(fmt::format("config.json: {} \"{}\": {}", key, got, why));
  }
  // A key that must be absent, null or false (a feature meshtrain's model does not have).
  void absent_or_false(const char* key, const std::string& why) {
    const json* v = find(key);
    if (v == nullptr || v->is_null() || (v->is_boolean() && !v->get<bool>())) return;
    problems.push_back(fmt::format("config.json: {} {}: {}", key, v->dump(), why));
  }
  bool flag(const char* key, bool fallback) {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      wrong_type(key, "true or false");
      return fallback;
    }
    return v->get<bool>();
  }

  std::vector<std::string> problems;

 private:
  const json* find(const char* key) const { return j_.contains(key) ? &j_.at(key) : nullptr; }
  std::optional<std::int64_t> get_int(const char* key, std::optional<std::int64_t> fallback) {
    const json* v = find(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_number_integer()) {
      wrong_type(key, "an integer");
      return std::nullopt;
    }
    return v->get<std::int64_t>();
  }
  void differ(const char* key, const std::string& got, const char* setting,
              const std::string& want) {
    problems.push_back(
        fmt::format("config.json: {} {}, the run has {} = {}", key, got, setting, want));
  }
  void wrong_type(const char* key, const char* what) {
    problems.push_back(fmt::format("config.json: {} is {}, not {}", key, j_.at(key).dump(), what));
  }

  const json& j_;
};

void compare_gpt2(Comparer& c, const ModelConfig& m) {
  c.integer("n_layer", m.n_layer, "model.n_layer", 12);
  c.integer("n_head", m.n_head, "model.n_head", 12);
  c.integer("n_embd", m.n_embd, "model.n_embd", 768);
  c.integer("vocab_size", m.vocab_size, "model.vocab_size", 50257);
  c.integer("n_positions", m.block_size, "model.block_size", 1024);
  c.integer("n_inner", ffn_hidden_of(m), "model.ffn_hidden", 4 * m.n_embd);  // null: 4·C
  c.number("layer_norm_epsilon", m.norm_eps, "model.norm_eps", 1e-5);
  c.one_of("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "gelu_new",
           "meshtrain's gpt2 uses GELU's tanh approximation (gelu_new)");
  c.absent_or_false("scale_attn_by_inverse_layer_idx",
                    "meshtrain scales attention by 1/√head_dim only");
  if (!c.flag("scale_attn_weights", true)) {
    c.problems.emplace_back(
        "config.json: scale_attn_weights false, but meshtrain scales attention by 1/√head_dim");
  }
  if (!c.flag("tie_word_embeddings", true)) {
    c.problems.emplace_back(
        "config.json: tie_word_embeddings false, but meshtrain's gpt2 ties the LM head to wte");
  }
}

void compare_llama(Comparer& c, const ModelConfig& m, bool mixtral) {
  c.integer("num_hidden_layers", m.n_layer, "model.n_layer");
  c.integer("num_attention_heads", m.n_head, "model.n_head");
  c.integer("num_key_value_heads", kv_heads_of(m), "model.n_kv_head", m.n_head);
  c.integer("hidden_size", m.n_embd, "model.n_embd");
  c.integer("intermediate_size", mixtral ? moe_ffn_hidden_of(m) : ffn_hidden_of(m),
            mixtral ? "model.moe_ffn_hidden" : "model.ffn_hidden");
  c.integer("vocab_size", m.vocab_size, "model.vocab_size");
  c.integer("head_dim", m.n_embd / m.n_head, "model.n_embd / model.n_head");
  c.number("rms_norm_eps", m.norm_eps, "model.norm_eps", 1e-6);
  c.number("rope_theta", m.rope_theta, "model.rope_theta", mixtral ? 1e6 : 1e4);
  c.one_of("hidden_act", {"silu"}, "silu", "meshtrain's llama MLP is SwiGLU (silu)");
  c.absent_or_false("attention_bias", "meshtrain's llama has no attention biases");
  c.absent_or_false("mlp_bias", "meshtrain's llama has no MLP biases");
  c.absent_or_false("rope_scaling", "meshtrain's rotary embedding has no scaling");
  if (mixtral) {
    c.integer("num_local_experts", m.moe_experts, "model.moe_experts", 8);
    c.integer("num_experts_per_tok", m.moe_top_k, "model.moe_top_k", 2);
  }
}

}  // namespace

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

std::string hf_config_json(const ModelConfig& m, const HfTokenIds& ids) {
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
  const auto id_or_null = [](std::optional<std::int64_t> id) {
    return id ? nlohmann::ordered_json(*id) : nlohmann::ordered_json(nullptr);
  };
  j["bos_token_id"] = id_or_null(ids.bos);
  j["eos_token_id"] = id_or_null(ids.eos);
  j["meshtrain_note"] = "written by meshtrain export; tokenizer: the run's meta.json";
  return j.dump(2) + "\n";
}

HfConfigCheck check_hf_config(const std::filesystem::path& file, const ModelConfig& m) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec || size > kMaxConfigBytes) {
    throw DataError(fmt::format("{}: {}", file.string(),
                                ec ? "cannot read its size" : "larger than any config.json"));
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!in || j.is_discarded() || !j.is_object()) {
    throw DataError(fmt::format("{}: not a JSON object (Hugging Face config.json)", file.string()));
  }
  Comparer c(j);
  const bool gpt2 = m.family == ModelFamily::gpt2;
  const std::string want = gpt2 ? "gpt2" : m.moe_experts > 0 ? "mixtral" : "llama";
  const std::string type = j.contains("model_type") && j["model_type"].is_string()
                               ? j["model_type"].get<std::string>()
                               : "";
  HfConfigCheck out;
  if (type != want) {
    out.problems.push_back(fmt::format(
        "config.json: model_type \"{}\", the run's model (model.family = {}{}) is {}", type,
        to_string(m.family), m.moe_experts > 0 ? ", model.moe_experts > 0" : "", want));
    return out;
  }
  if (gpt2) {
    compare_gpt2(c, m);
  } else {
    compare_llama(c, m, want == "mixtral");
  }
  out.tied_head = c.flag("tie_word_embeddings", gpt2);  // GPT2Config's default, LlamaConfig's
  out.problems = std::move(c.problems);
  return out;
}

}  // namespace meshtrain
