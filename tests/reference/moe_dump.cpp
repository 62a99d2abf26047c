// tests/reference/moe_dump.cpp
//
// Writes what one SparseMoeBlock (transformer/moe.h) computes, for moe_reference.py to check
// against Hugging Face transformers' MixtralSparseMoeBlock (dropless) and a PyTorch module
// written from the Switch Transformer capacity rule (capacity modes). Nothing expected is
// stored: the CTest test runs this program and the script, live.
//
//   moe_dump <out.safetensors> <variant>
//   variant: dropless | losses | capacity_probs | capacity_position
//
// The file holds (safetensors F32 unless noted; scalars as 1-element tensors):
//   <name>            every parameter (HF Mixtral names, prefix model.layers.0)
//   x [N, C], R [N, C] random input and the output weighting: the loss is Σ out·R + aux + z
//   out [N, C], logits [N, E]
//   grad.x, grad.<name>  gradients of that loss
//   aux_loss, z_loss, load_balance, router_z [1]; tokens_per_expert, routed_per_expert [E] I32
// and metadata: format_version, config (JSON: C, F, E, k, N, capacity factor, policy, coeffs).
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/placements.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/transformer/moe.h"

namespace meshtrain {
namespace {

constexpr int kFormatVersion = 1;
constexpr std::int64_t kBatch = 2, kSeqLen = 16, kTokens = kBatch * kSeqLen;

Tensor scalar(double v) {
  Tensor t = Tensor::empty({1}, MemCategory::other);
  t.f32()[0] = static_cast<float>(v);
  return t;
}

Tensor counts(const std::vector<std::int64_t>& c) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(c.size())}, MemCategory::other, DType::i32);
  for (std::size_t i = 0; i < c.size(); ++i) t.i32()[i] = static_cast<std::int32_t>(c[i]);
  return t;
}

Tensor random(Shape shape, const char* name) {
  Tensor t = Tensor::empty(std::move(shape), MemCategory::other);
  fill_normal(t.span_f32(), 1234, stream_of(name), 0, 0.0f, 1.0f);
  return t;
}

MoeOptions options_of(const std::string& variant) {
  if (variant == "dropless") return {};
  // Coefficients far above the usual 1e-2 / 1e-3: at those, dropping the aux (z) term's
  // gradient moves the router's gradient by only 9e-6 (4e-5) of its largest element, below the
  // 1e-4 tolerance; at 1.0 / 0.1 by ≈1e-3 / 4e-3, so the check sees each term.
  if (variant == "losses") return {.moe_aux_loss_coeff = 1.0, .moe_z_loss_coeff = 0.1};
  if (variant == "capacity_probs" || variant == "capacity_position") {
    return {.moe_capacity_factor = 1.0,
            .moe_token_drop_policy =
                variant == "capacity_probs" ? MoeDropPolicy::probs : MoeDropPolicy::position,
            .moe_aux_loss_coeff = 0.01,
            .moe_z_loss_coeff = 0.001};
  }
  throw std::invalid_argument("unknown variant " + variant);
}

int run(const std::string& out_path, const std::string& variant) {
  // Router std 0.3 (not 0.02) so the routing is decisive and uneven: capacity 1.0 drops.
  const MoeShape shape{.n_embd = 32, .moe_experts = 4, .moe_top_k = 2, .moe_ffn_hidden = 48,
                       .init_std = 0.3f, .proj_init_std = 0.1f};
  const MoeOptions options = options_of(variant);
  SparseMoeBlock layer("model.layers.0", shape, options,
                       test::records_table({test::moe_records("model.layers.0", shape.moe_experts,
                                                              shape.n_embd, shape.moe_ffn_hidden)}));
  std::vector<NamedTensor> out;
  for (Parameter* p : layer.parameters()) {
    initialize(*p, 1234);
    out.push_back({p->name, p->value.clone(MemCategory::other)});
  }
  const Tensor x = random({kTokens, shape.n_embd}, "moe_reference.x");
  const Tensor R = random({kTokens, shape.n_embd}, "moe_reference.R");
  out.push_back({"x", x});
  out.push_back({"R", R});
  out.push_back({"out", layer.forward(x, {kBatch, kSeqLen}, {}).clone(MemCategory::other)});
  out.push_back({"logits", layer.last_logits().clone(MemCategory::other)});
  const MoeStats stats = layer.stats();
  out.push_back({"grad.x", layer.backward(R, {}).clone(MemCategory::other)});
  for (const Parameter* p : layer.parameters()) {
    out.push_back({"grad." + p->name, p->grad.clone(MemCategory::other)});
  }
  out.push_back({"aux_loss", scalar(stats.losses.aux_loss)});
  out.push_back({"z_loss", scalar(stats.losses.z_loss)});
  out.push_back({"load_balance", scalar(stats.losses.load_balance)});
  out.push_back({"router_z", scalar(stats.losses.router_z)});
  out.push_back({"tokens_per_expert", counts(stats.tokens_per_expert)});
  out.push_back({"routed_per_expert", counts(stats.routed_per_expert)});
  const nlohmann::json config = {{"n_embd", shape.n_embd},
                                 {"ffn_hidden", shape.moe_ffn_hidden},
                                 {"experts", shape.moe_experts},
                                 {"top_k", shape.moe_top_k},
                                 {"tokens", kTokens},
                                 {"batch", kBatch},
                                 {"capacity_factor", options.moe_capacity_factor},
                                 {"drop_policy", to_string(options.moe_token_drop_policy)},
                                 {"aux_loss_coeff", options.moe_aux_loss_coeff},
                                 {"z_loss_coeff", options.moe_z_loss_coeff},
                                 {"variant", variant}};
  write_safetensors(out_path, out,
                    {{"format_version", std::to_string(kFormatVersion)},
                     {"config", config.dump()},
                     {"generator", "tests/reference/moe_dump.cpp"}});
  fmt::print("moe_dump: {} ({} tensors, {} of {} assignments dropped)\n", out_path, out.size(),
             stats.dropped, kTokens * shape.moe_top_k);
  return 0;
}

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: moe_dump <out.safetensors> "
                 "dropless|losses|capacity_probs|capacity_position\n");
    return 2;
  }
  try {
    return meshtrain::run(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_dump: %s\n", e.what());
    return 1;
  }
}
