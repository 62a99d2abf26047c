// checkpoint/hf_format.h: the Hugging Face name and layout table of both families, the
// transposes, config.json, and the HfImport checks that need no training run (the round trip
// under tp/dp/ZeRO is tests/dist/checkpoint/export_import_test.cpp; logits against PyTorch are
// tests/reference/hf_export_reference.py).
#include "meshtrain/checkpoint/hf_format.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

ModelConfig tiny(ModelFamily family, bool bias) {
  ModelConfig m;
  m.family = family;
  m.n_layer = 1;
  m.n_head = 2;
  m.n_embd = 8;
  m.block_size = 4;
  m.vocab_size = 5;
  m.bias = bias;
  if (family == ModelFamily::llama) {
    m.n_kv_head = 1;
    m.ffn_hidden = 12;
  }
  return m;
}

const HfTensor* find(const std::vector<HfTensor>& specs, const std::string& hf_name) {
  for (const HfTensor& s : specs) {
    if (s.hf_name == hf_name) return &s;
  }
  return nullptr;
}

TEST(HfFormat, Gpt2Conv1DWeightsAreTransposedAndBiasFreeModelsGetZeroBiases) {
  const std::vector<HfTensor> specs = hf_tensors(tiny(ModelFamily::gpt2, false));
  const HfTensor* c_attn = find(specs, "transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);
  EXPECT_TRUE(c_attn->transposed);
  EXPECT_EQ(c_attn->shape, (Shape{24, 8}));
  EXPECT_EQ(c_attn->hf_shape(), (Shape{8, 24}));  // Conv1D [in, out]
  for (const char* name : {"transformer.h.0.attn.c_proj.weight", "transformer.h.0.mlp.c_fc.weight",
                           "transformer.h.0.mlp.c_proj.weight"}) {
    ASSERT_NE(find(specs, name), nullptr) << name;
    EXPECT_TRUE(find(specs, name)->transposed) << name;
  }
  EXPECT_FALSE(find(specs, "transformer.wte.weight")->transposed);
  EXPECT_EQ(find(specs, "lm_head.weight"), nullptr);  // tied: not in HF GPT-2 files
  const HfTensor* bias = find(specs, "transformer.h.0.mlp.c_fc.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_TRUE(bias->name.empty());  // a zero bias, no meshtrain parameter
  EXPECT_EQ(bias->shape, (Shape{32}));
  EXPECT_NE(find(specs, "transformer.ln_f.bias"), nullptr);
  EXPECT_EQ(find(specs, "transformer.wte.bias"), nullptr);
}

TEST(HfFormat, LlamaKeepsNamesAndLayouts) {
  const std::vector<HfTensor> specs = hf_tensors(tiny(ModelFamily::llama, false));
  for (const HfTensor& s : specs) {
    EXPECT_EQ(s.hf_name, s.name);
    EXPECT_FALSE(s.transposed) << s.name;
  }
  ASSERT_NE(find(specs, "lm_head.weight"), nullptr);
  EXPECT_EQ(find(specs, "model.layers.0.self_attn.k_proj.weight")->shape, (Shape{4, 8}));
}

TEST(HfFormat, ToHfAndBackIsTheIdentityAndTransposes) {
  const HfTensor spec{.hf_name = "w", .name = "w", .shape = {2, 3}, .transposed = true};
  Tensor t = Tensor::empty({2, 3}, MemCategory::other);
  for (int i = 0; i < 6; ++i) t.f32()[i] = static_cast<float>(i);
  const Tensor hf = to_hf(t, spec);
  ASSERT_EQ(hf.shape(), (Shape{3, 2}));
  EXPECT_EQ(hf.f32()[1], 3.0f);  // hf[0][1] = t[1][0]
  const Tensor back = from_hf(hf, spec);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back.f32()[i], t.f32()[i]);
}

TEST(HfFormat, ConfigJsonCarriesTheSizes) {
  const auto gpt2 = nlohmann::json::parse(hf_config_json(tiny(ModelFamily::gpt2, true)));
  EXPECT_EQ(gpt2["model_type"], "gpt2");
  EXPECT_EQ(gpt2["n_embd"], 8);
  EXPECT_EQ(gpt2["n_inner"], 32);
  EXPECT_EQ(gpt2["n_positions"], 4);
  EXPECT_EQ(gpt2["tie_word_embeddings"], true);
  const auto llama = nlohmann::json::parse(hf_config_json(tiny(ModelFamily::llama, false)));
  EXPECT_EQ(llama["model_type"], "llama");
  EXPECT_EQ(llama["num_key_value_heads"], 1);
  EXPECT_EQ(llama["intermediate_size"], 12);
  EXPECT_EQ(llama["tie_word_embeddings"], false);
}

TEST(HfFormat, ExportRejectsAMissingParameterAndImportANonZeroBiasOfABiasFreeModel) {
  const auto dir = std::filesystem::temp_directory_path() / "meshtrain_hf_format_test";
  std::filesystem::create_directories(dir);
  Config config;
  config.model = tiny(ModelFamily::gpt2, false);
  std::vector<NamedTensor> logical;
  for (const HfTensor& s : hf_tensors(config.model)) {
    if (!s.name.empty()) logical.push_back({s.name, Tensor::zeros(s.shape, MemCategory::other)});
  }
  const std::vector<NamedTensor> complete = logical;
  logical.pop_back();  // transformer.ln_f.weight
  try {
    export_hf(logical, config, dir / "model.safetensors");
    ADD_FAILURE() << "export without transformer.ln_f.weight succeeded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.ln_f.weight"), std::string::npos) << e.what();
  }
  // A file with a non-zero bias: valid for a model with biases, not for one without.
  config.model.bias = true;
  std::vector<NamedTensor> with_bias;
  for (const HfTensor& s : hf_tensors(config.model)) {
    Tensor t = Tensor::zeros(s.shape, MemCategory::other);
    if (s.name == "transformer.h.0.ln_2.bias") t.fill(0.5f);
    with_bias.push_back({s.name, t});
  }
  export_hf(with_bias, config, dir / "biased.safetensors");
  EXPECT_TRUE(std::filesystem::exists(dir / "config.json"));
  HfImport(dir / "biased.safetensors", config.model).check_values();
  const HfImport bias_free(dir / "biased.safetensors", tiny(ModelFamily::gpt2, false));
  try {
    bias_free.check_values();
    ADD_FAILURE() << "a non-zero bias was accepted by a bias-free model";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.0.ln_2.bias holds non-zero values"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The tiny llama as a Mixtral: 3 experts of F = 6, top-2, MoE in every layer.
ModelConfig tiny_mixtral() {
  ModelConfig m = tiny(ModelFamily::llama, false);
  m.n_layer = 2;
  m.moe_experts = 3;
  m.moe_top_k = 2;
  m.moe_ffn_hidden = 6;
  m.moe_aux_loss_coeff = 0.02;
  return m;
}

// Zero tensors under meshtrain's names, one per parameter of `m`.
std::vector<NamedTensor> zero_model(const ModelConfig& m) {
  std::vector<NamedTensor> out;
  for (const HfTensor& s : hf_tensors(m))
    out.push_back({s.name, Tensor::zeros(s.shape, MemCategory::other)});
  return out;
}

TEST(HfFormat, MixtralNamesAndLayouts) {
  const std::vector<HfTensor> specs = hf_tensors(tiny_mixtral());
  for (const HfTensor& s : specs) {
    EXPECT_EQ(s.hf_name, s.name);
    EXPECT_FALSE(s.transposed) << s.name;
    EXPECT_EQ(s.name.find(".mlp."), std::string::npos) << s.name << ": a dense MLP in a Mixtral";
  }
  for (int layer = 0; layer < 2; ++layer) {
    const std::string moe = fmt::format("model.layers.{}.block_sparse_moe.", layer);
    ASSERT_NE(find(specs, moe + "gate.weight"), nullptr) << layer;
    EXPECT_EQ(find(specs, moe + "gate.weight")->shape, (Shape{3, 8}));  // [E, C]
    for (int j = 0; j < 3; ++j) {
      const std::string e = fmt::format("{}experts.{}.", moe, j);
      ASSERT_NE(find(specs, e + "w1.weight"), nullptr) << e;
      EXPECT_EQ(find(specs, e + "w1.weight")->shape, (Shape{6, 8}));  // [F, C]
      EXPECT_EQ(find(specs, e + "w3.weight")->shape, (Shape{6, 8}));
      EXPECT_EQ(find(specs, e + "w2.weight")->shape, (Shape{8, 6}));  // [C, F]
    }
    EXPECT_EQ(find(specs, moe + "experts.3.w1.weight"), nullptr);
  }
  EXPECT_NE(find(specs, "model.layers.1.post_attention_layernorm.weight"), nullptr);
  EXPECT_NE(find(specs, "lm_head.weight"), nullptr);
}

TEST(HfFormat, MixtralConfigJsonUsesMixtralConfigNames) {
  const auto j = nlohmann::json::parse(hf_config_json(tiny_mixtral()));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(j["model_type"], "mixtral");
  EXPECT_EQ(j["num_local_experts"], 3);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["intermediate_size"], 6);  // the expert F, not the dense ffn_hidden (12)
  EXPECT_EQ(j["router_aux_loss_coef"], 0.02);
  EXPECT_EQ(j["num_hidden_layers"], 2);
  EXPECT_EQ(j["num_key_value_heads"], 1);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_FALSE(j.contains("head_dim"));  // MixtralConfig (4.36.2) has none: n_embd / n_head
}

TEST(HfFormat, MoeEveryNthLayerDoesNotExport) {
  Config config;
  config.source = "run/config.toml";
  config.model = tiny_mixtral();
  config.model.moe_layer_freq = 2;
  const auto dir = std::filesystem::temp_directory_path() / "meshtrain_hf_format_freq_test";
  std::filesystem::create_directories(dir);
  for (const auto& attempt :
       {std::function<void()>([&] { hf_config_json(config.model); }), std::function<void()>([&] {
          export_hf(zero_model(config.model), config, dir / "model.safetensors");
        })}) {
    try {
      attempt();
      ADD_FAILURE() << "a MoE model with moe_layer_freq = 2 exported";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("model.moe_layer_freq"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("every layer"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  std::filesystem::remove_all(dir);
}

TEST(HfFormat, ImportNamesAMoeMismatch) {
  const auto dir = std::filesystem::temp_directory_path() / "meshtrain_hf_format_moe_test";
  std::filesystem::create_directories(dir);
  Config mixtral;
  mixtral.model = tiny_mixtral();
  // Each in its own directory: config.json beside a file is checked against the model too.
  std::filesystem::create_directories(dir / "mixtral");
  std::filesystem::create_directories(dir / "dense");
  export_hf(zero_model(mixtral.model), mixtral, dir / "mixtral" / "model.safetensors");
  Config dense;
  dense.model = tiny(ModelFamily::llama, false);
  dense.model.n_layer = 2;
  export_hf(zero_model(dense.model), dense, dir / "dense" / "model.safetensors");
  HfImport(dir / "mixtral", mixtral.model).check_values();  // the round trip

  ModelConfig four = tiny_mixtral();
  four.moe_experts = 4;
  ModelConfig every_other = tiny_mixtral();
  every_other.moe_layer_freq = 2;
  const struct {
    std::string file;
    ModelConfig model;
    std::string says;
  } cases[] = {
      {"mixtral", dense.model,
       "Mixtral-style MoE model with 3 experts per layer, the config says "
       "model.moe_experts = 0 (a dense model)"},
      {"dense", mixtral.model,
       "the file holds a dense model, the config says model.moe_experts = 3"},
      {"mixtral", four, "3 experts per layer, the config says model.moe_experts = 4"},
      {"mixtral", every_other, "model.moe_layer_freq = 2"},
  };
  for (const auto& c : cases) {
    try {
      HfImport(dir / c.file / "model.safetensors", c.model);
      ADD_FAILURE() << c.file << " imported into a mismatched model: " << c.says;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain
