// checkpoint/hf_format.h: the Hugging Face name and layout table of both families, the
// transposes, config.json, and the HfImport checks that need no training run (the round trip
// under tp/dp/ZeRO is tests/dist/export_import_test.cpp; logits against PyTorch are
// tests/reference/hf_export_reference.py).
#include "meshtrain/checkpoint/hf_format.h"

#include <gtest/gtest.h>

#include <filesystem>
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

}  // namespace
}  // namespace meshtrain
