// tests/reference/export_dump.cpp
//
// The C++ half of reference.export_matches_pytorch: builds a small single-process GPT-2 (with
// or without biases), Llama (GQA 4/2 heads, RoPE, SwiGLU, untied head) or Mixtral (that Llama
// with a sparse MoE block of 4 SwiGLU experts of 48, top-2, in every layer), moves every
// parameter away from its initial value (N(0, 0.05²) noise added, so norm weights are not all
// one and biases not all zero: a tensor the export dropped or transposed wrongly changes the
// logits), and writes
//   <out>/ckpt/model.safetensors, <out>/ckpt/config.toml   a final-checkpoint directory, the
//                                                         input of `meshtrain export`
//   <out>/expected.safetensors   tokens [batch, T] I32 and meshtrain's logits [batch·T, V] F32
// hf_export_reference.py then loads the export (Hugging Face names and layouts) into PyTorch
// and compares the logits.
//
//   export_dump <out dir> [--no-bias | --llama | --mixtral]
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "dump_main.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/model/causal_lm.h"

namespace meshtrain {
namespace {

constexpr std::uint64_t kSeed = 4321;
constexpr std::int64_t kBatch = 3;

int run(const std::filesystem::path& out, const std::string& variant) {
  Config config;
  config.source = "export_dump";
  ModelConfig& mc = config.model;
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_embd = 64;
  mc.block_size = 16;
  mc.vocab_size = 65;
  mc.bias = variant == "gpt2";
  if (variant == "llama" || variant == "mixtral") {
    mc.family = ModelFamily::llama;
    mc.n_kv_head = 2;
    mc.ffn_hidden = 96;
    mc.rope_theta = 500.0;  // not the default: config.json must carry it
    mc.norm_eps = 1e-6;
  }
  if (variant == "mixtral") {
    mc.moe_experts = 4;
    mc.moe_top_k = 2;
    mc.moe_ffn_hidden = 48;  // not ffn_hidden: config.json's intermediate_size must be this
    mc.moe_aux_loss_coeff = 0.01;
  }
  const auto self = single_rank_group("tp");
  CausalLm model(mc, kSeed, TensorParallel{*self});
  std::vector<NamedTensor> params;
  for (Parameter* p : model.parameters()) {
    std::vector<float> noise(static_cast<std::size_t>(p->value.numel()));
    fill_normal(noise, kSeed, stream_of("export_dump." + p->name), 0, 0.0f, 0.05f);
    float* v = p->value.f32();
    for (std::size_t i = 0; i < noise.size(); ++i) v[i] += noise[i];
    params.push_back({p->name, p->value.clone(MemCategory::other)});
  }
  const std::int64_t T = mc.block_size;
  Tensor tokens = Tensor::empty({kBatch, T}, MemCategory::other, DType::i32);
  const std::uint64_t stream = stream_of("export_dump.tokens");
  for (std::int64_t i = 0; i < kBatch * T; ++i) {
    tokens.i32()[i] =
        static_cast<std::int32_t>(philox_u64(kSeed, stream, static_cast<std::uint64_t>(i)) %
                                  static_cast<std::uint64_t>(mc.vocab_size));
  }
  const Tensor logits = model.logits(tokens.i32(), kBatch, T, {}).clone(MemCategory::other);

  std::filesystem::create_directories(out / "ckpt");
  write_safetensors(out / "ckpt" / "model.safetensors", params, {{"format", "meshtrain-model-v1"}});
  const std::string toml = to_toml(config);
  StagedFile(out / "ckpt" / "config.toml", std::as_bytes(std::span<const char>(toml))).commit();
  write_safetensors(out / "expected.safetensors", {{"tokens", tokens}, {"logits", logits}},
                    {{"variant", variant}, {"generator", "tests/reference/export_dump.cpp"}});
  fmt::print("export_dump: {} parameters of a {} model and its logits [{}, {}] in {}\n",
             params.size(), variant, logits.dim(0), logits.dim(1), out.string());
  return 0;
}

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  return meshtrain::test::dump_main(
      argc, argv, "export_dump", "<out dir>",
      [](const char* out, const std::string& variant) { return meshtrain::run(out, variant); },
      /*mixtral=*/true);
}
