// tests/reference/reference_dump.cpp
//
// Writes what the single-process C++ model computes for a small GPT-2 or Llama model, for
// gpt_reference.py to check against PyTorch (DESIGN invariant 4: single-process math is PyTorch's
// math). Nothing expected is stored anywhere: the CTest test runs this program and the script,
// live.
//
//   reference_dump <out.safetensors> [--no-bias | --llama]
//
// --llama: the llama family with grouped-query attention (4 heads, 2 kv heads), rotary
// embedding, SwiGLU, RMSNorm and an untied head (no biases).
// The file holds (safetensors, F32 unless noted; scalars as 1-element tensors):
//   <name>                every parameter's initial value, Hugging Face GPT-2 / Llama names
//   tokens, targets       [batch, T] I32, random from Philox
//   logits [batch·T, V]   from the initial weights
//   loss [1], grad.<name> the mean loss and its gradients after one forward/backward
//   losses [steps], grad_norms [steps], clip_coefs [steps]
//                         per training step on the same batch (forward, backward, global
//                         grad norm, clipping, AdamW): the loss before the update, the
//                         pre-clipping norm, and max_norm / (norm + 1e-6) (clipped iff < 1)
//   opt.grad<k>.<name>    the raw (unclipped) gradient of step k (1-based)
//   opt.clipped<k>.<name> the same after clipping, as AdamW received it
//   opt.param<k>.<name>   every parameter after step k's AdamW update
// and metadata: format_version, config and optimizer (JSON), seed.
// The opt.* tensors let the script replay torch.optim.AdamW on exactly our gradients, which
// checks the optimizer alone, without the noise Adam amplifies from two slightly different
// gradients (m/√v is ill-conditioned where a gradient element is near zero).
// Uses: model/, optim/, checkpoint/safetensors.h, comm/single_rank_group.h.
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "dump_main.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/config/config.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/core/tensor.h"
#include "meshtrain/model/causal_lm.h"
#include "meshtrain/optim/adamw.h"

namespace meshtrain {
namespace {

constexpr int kFormatVersion = 1;
constexpr std::uint64_t kSeed = 1234;
constexpr std::int64_t kBatch = 4;
constexpr int kSteps = 5;
constexpr double kLr = 1e-3;
// Below the gradient norm of every one of the steps (≈1.4–2.5 for this model and batch), so
// each step really clips; run() fails if one does not.
constexpr double kGradClip = 0.5;

Tensor scalar_tensor(double x) {
  Tensor t = Tensor::empty({1}, MemCategory::other);
  t.f32()[0] = static_cast<float>(x);
  return t;
}

Tensor vector_tensor(const std::vector<double>& xs) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(xs.size())}, MemCategory::other);
  for (std::size_t i = 0; i < xs.size(); ++i) t.f32()[i] = static_cast<float>(xs[i]);
  return t;
}

int run(const std::string& out_path, const std::string& variant, ProcessGroup& self) {
  ModelConfig mc;
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_embd = 64;  // head_dim 16
  mc.block_size = 16;
  mc.vocab_size = 65;
  mc.bias = variant == "gpt2";
  if (variant == "llama") {
    mc.family = ModelFamily::llama;
    mc.n_kv_head = 2;
    mc.ffn_hidden = 96;  // not 4·C: the SwiGLU hidden size is its own setting
    mc.rope_theta = 10000.0;
  }
  const std::int64_t T = mc.block_size;
  const AdamWConfig oc{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

  CausalLm model(mc, kSeed, TensorParallel{self});
  std::vector<NamedTensor> out;
  for (const Parameter* p : model.parameters()) {
    out.push_back({p->name, p->value.clone(MemCategory::other)});
  }

  // Independent random tokens and targets: a batch 5 steps cannot fit, so the gradient stays
  // large and clipping keeps triggering.
  Tensor tokens = Tensor::empty({kBatch, T}, MemCategory::other, DType::i32);
  Tensor targets = Tensor::empty({kBatch, T}, MemCategory::other, DType::i32);
  const std::uint64_t tok_stream = stream_of("reference.tokens");
  const std::uint64_t tgt_stream = stream_of("reference.targets");
  const auto V = static_cast<std::uint64_t>(mc.vocab_size);
  for (std::int64_t i = 0; i < kBatch * T; ++i) {
    const auto idx = static_cast<std::uint64_t>(i);
    tokens.i32()[i] = static_cast<std::int32_t>(philox_u64(kSeed, tok_stream, idx) % V);
    targets.i32()[i] = static_cast<std::int32_t>(philox_u64(kSeed, tgt_stream, idx) % V);
  }
  out.push_back({"tokens", tokens});
  out.push_back({"targets", targets});

  // logits() before forward(): both run the trunk, and backward needs forward's state.
  out.push_back({"logits", model.logits(tokens.i32(), kBatch, T, {}).clone(MemCategory::other)});

  AdamW optimizer(model.parameters(), oc);
  std::vector<double> losses, norms, coefs;
  for (int k = 1; k <= kSteps; ++k) {
    model.zero_grad();
    const float loss = model.forward(tokens.i32(), targets.i32(), kBatch, T, {});
    model.backward(1.0f, {});
    const double norm = global_grad_norm(model.parameters());
    for (const Parameter* p : model.parameters()) {
      if (k == 1) out.push_back({"grad." + p->name, p->grad.clone(MemCategory::other)});
      out.push_back({fmt::format("opt.grad{}.{}", k, p->name), p->grad.clone(MemCategory::other)});
    }
    if (k == 1) out.push_back({"loss", scalar_tensor(loss)});
    clip_grads(model.parameters(), norm, kGradClip);
    for (const Parameter* p : model.parameters()) {
      out.push_back(
          {fmt::format("opt.clipped{}.{}", k, p->name), p->grad.clone(MemCategory::other)});
    }
    optimizer.step(kLr);
    for (const Parameter* p : model.parameters()) {
      out.push_back(
          {fmt::format("opt.param{}.{}", k, p->name), p->value.clone(MemCategory::other)});
    }
    const double coef = kGradClip / (norm + 1e-6);
    fmt::print("step {}: loss {:.6f}  grad_norm {:.6f}  clip_coef {:.4f}{}\n", k, loss, norm, coef,
               coef < 1.0 ? "  (clipped)" : "");
    if (coef >= 1.0) {
      fmt::print(stderr,
                 "reference_dump: step {} did not clip (norm {} ≤ grad_clip {}); lower "
                 "kGradClip so the clipping path is tested\n",
                 k, norm, kGradClip);
      return 1;
    }
    losses.push_back(loss);
    norms.push_back(norm);
    coefs.push_back(coef);
  }
  out.push_back({"losses", vector_tensor(losses)});
  out.push_back({"grad_norms", vector_tensor(norms)});
  out.push_back({"clip_coefs", vector_tensor(coefs)});

  const nlohmann::json config = {{"family", mc.family},
                                 {"n_layer", mc.n_layer},
                                 {"n_head", mc.n_head},
                                 {"n_kv_head", kv_heads_of(mc)},
                                 {"n_embd", mc.n_embd},
                                 {"ffn_hidden", ffn_hidden_of(mc)},
                                 {"block_size", mc.block_size},
                                 {"vocab_size", mc.vocab_size},
                                 {"bias", mc.bias},
                                 {"layer_norm_eps", mc.norm_eps},
                                 {"rope_theta", mc.rope_theta},
                                 {"batch", kBatch}};
  const nlohmann::json optim = {{"lr", kLr},
                                {"beta1", oc.beta1},
                                {"beta2", oc.beta2},
                                {"eps", oc.eps},
                                {"weight_decay", oc.weight_decay},
                                {"grad_clip", kGradClip},
                                {"steps", kSteps}};
  write_safetensors(out_path, out,
                    {{"format_version", std::to_string(kFormatVersion)},
                     {"config", config.dump()},
                     {"optimizer", optim.dump()},
                     {"seed", std::to_string(kSeed)},
                     {"generator", "tests/reference/reference_dump.cpp"}});
  fmt::print("wrote {} tensors to {} ({})\n", out.size(), out_path, variant);
  return 0;
}

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  return meshtrain::test::dump_main(argc, argv, "reference_dump", "<out.safetensors>",
                                    [](const char* out, const std::string& variant) {
                                      const auto self = meshtrain::single_rank_group("tp");
                                      return meshtrain::run(out, variant, *self);
                                    });
}
