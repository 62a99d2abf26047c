#include "meshtrain/plan/presets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>

#include "meshtrain/config/load.h"
#include "meshtrain/core/error.h"

namespace meshtrain::plan {
namespace {

ModelConfig llama(std::int64_t layers, std::int64_t hidden, std::int64_t heads,
                  std::int64_t kv_heads, std::int64_t ffn, std::int64_t vocab, std::int64_t seq,
                  double rope_theta) {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.n_layer = layers;
  m.n_embd = hidden;
  m.n_head = heads;
  m.n_kv_head = kv_heads;
  m.ffn_hidden = ffn;
  m.vocab_size = vocab;
  m.block_size = seq;
  m.bias = false;
  m.rope_theta = rope_theta;
  return m;
}

std::vector<ModelPreset> make_presets() {
  std::vector<ModelPreset> out;
  // Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (GPT-3 175B: 96
  // layers, d_model 12288, 96 heads, context 2048) and §2.1 (GPT-2's architecture: learned
  // positions, LayerNorm, biases, MLP 4·d_model, the 50257-token BPE vocabulary).
  ModelConfig gpt3;
  gpt3.family = ModelFamily::gpt2;
  gpt3.n_layer = 96;
  gpt3.n_embd = 12288;
  gpt3.n_head = 96;
  gpt3.block_size = 2048;
  gpt3.vocab_size = 50257;
  gpt3.bias = true;
  out.push_back({.name = "gpt3-175b", .model = gpt3, .source = "Brown et al. 2020, Table 2.1"});
  // Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3): 8B 32 × 4096, 32
  // heads, 8 kv heads, FFN 14336; 70B 80 × 8192, 64 heads, 8 kv, FFN 28672; 405B 126 × 16384,
  // 128 heads, 8 kv, FFN 53248; vocabulary 128256, RoPE θ = 500000, pre-training context 8192.
  const char* kLlama3 = "Dubey et al. 2024 (Llama 3), Table 3";
  out.push_back({.name = "llama3-8b",
                 .model = llama(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0),
                 .source = kLlama3});
  out.push_back({.name = "llama3-70b",
                 .model = llama(80, 8192, 64, 8, 28672, 128256, 8192, 500000.0),
                 .source = kLlama3});
  out.push_back({.name = "llama3-405b",
                 .model = llama(126, 16384, 128, 8, 53248, 128256, 8192, 500000.0),
                 .source = kLlama3});
  // Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models", Table 2: the
  // "33B" model has 32.5B parameters, dimension 6656, 52 heads, 60 layers; §2.2: SwiGLU with
  // 2/3·4d hidden units (the released models round 17749 up to a multiple of 256: 17920), RoPE
  // θ = 10000, the 32000-token SentencePiece vocabulary, context 2048. LongChat (LMSYS 2023)
  // fine-tunes LLaMA models for long contexts; seed 000's "LongChat-32B" is this architecture.
  out.push_back({.name = "llama-33b",
                 .model = llama(60, 6656, 52, 52, 17920, 32000, 2048, 10000.0),
                 .source = "Touvron et al. 2023 (LLaMA), Table 2"});
  // Jiang et al. 2024, "Mixtral of Experts", Table 1 (and the released Mixtral-8x7B-v0.1
  // config.json: hidden_size 4096, num_hidden_layers 32, num_attention_heads 32,
  // num_key_value_heads 8, intermediate_size 14336, num_local_experts 8,
  // num_experts_per_tok 2, vocab_size 32000, max_position_embeddings 32768, rope_theta 1e6,
  // untied LM head): every block is a sparse MoE block of 8 SwiGLU experts of F = 14336, top-2.
  // §2: "trained with a context size of 32k tokens", the preset's sequence length (4096 is
  // Mistral 7B's sliding attention window, which Mixtral does not use). 46.7B parameters, 12.9B
  // active (§2); plan/moe.h counts them.
  ModelConfig mixtral = llama(32, 4096, 32, 8, 14336, 32000, 32768, 1e6);
  mixtral.moe_experts = 8;
  mixtral.moe_top_k = 2;
  mixtral.moe_ffn_hidden = 14336;
  mixtral.moe_layer_freq = 1;
  out.push_back({.name = "mixtral-8x7b",
                 .model = mixtral,
                 .source = "Jiang et al. 2024 (Mixtral), Table 1"});
  return out;
}

std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const ModelPreset& p : model_presets()) out.push_back(p.name);
  return out;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = make_presets();
  return presets;
}

ModelPreset model_from(const std::string& name_or_path) {
  if (name_or_path.ends_with(".toml")) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(name_or_path, ec) || !std::ifstream(name_or_path)) {
      // Not load_config_file's own error: its fix is a `meshtrain train` command line.
      throw ConfigError("--model",
                        {{"--model", name_or_path, "must be an existing, readable TOML file",
                          fmt::format("give the path of a meshtrain config (e.g. "
                                      "configs/llama_shakespeare.toml), or a preset: {}",
                                      fmt::join(names(), ", "))}});
    }
    const Config config = load_config_file(name_or_path);
    ModelPreset preset{.name = name_or_path, .model = config.model, .source = name_or_path};
    if (preset.model.vocab_size == 0) {
      // Training takes the vocabulary from the data's meta.json; the repo's configs train on
      // the character-level Tiny Shakespeare, 65 symbols (data/prepared/*/meta.json).
      preset.model.vocab_size = 65;
      preset.source += " (vocab_size 0 → 65, the shakespeare_char vocabulary)";
    }
    return preset;
  }
  for (const ModelPreset& p : model_presets()) {
    if (p.name != name_or_path) continue;
    return p;
  }
  throw ConfigError("--model", {{"--model", name_or_path, "unknown model preset",
                                 fmt::format("use one of {}, or a meshtrain TOML config "
                                             "(configs/*.toml)",
                                             fmt::join(names(), ", "))}});
}

}  // namespace meshtrain::plan
