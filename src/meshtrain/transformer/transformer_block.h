// src/meshtrain/transformer/transformer_block.h — the pre-norm residual block of GPT-2 (Radford et
// al. 2019, §2.3) and Llama (Touvron et al. 2023, §2.2): x + attn(norm_1(x)), then
// + mlp(norm_2(·)). The family decides the four parts and their names; the residual stream
// is [tokens, C], or [tokens/tp, C] under sequence parallelism.
#pragma once

#include <memory>

#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/module.h"

namespace meshtrain {

class ResidualNorm;

class TransformerBlock final : public Module {
 public:
  /// `recompute` = RecomputeMode::full: activation recompute (Chen et al. 2016; Korthikanti et
  /// al. 2022, §5, "full"): forward keeps only the block's input and drops everything its
  /// parts kept; backward runs the forward again from that input, then the backward. The
  /// recomputed forward does the same arithmetic on the same values, so gradients are bitwise
  /// those without recompute; it costs one more forward (and, under tp, its collectives) per
  /// block. none and selective change nothing here (selective lives in the attention, built
  /// with the same mode).
  TransformerBlock(std::unique_ptr<Module> norm_1, std::unique_ptr<Module> attn,
                   std::unique_ptr<Module> norm_2, std::unique_ptr<Module> mlp,
                   RecomputeMode recompute = RecomputeMode::none);

  Tensor forward(const Tensor& x, const SequenceBatch& batch,
                 const MicroBatchContext& ctx) override;
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) override;
  /// norm_1, attn, norm_2, mlp parameters, in that order.
  ParameterList parameters() override;
  void discard(const MicroBatchContext& ctx) override;

 private:
  Tensor run(const Tensor& x, const SequenceBatch& batch, const MicroBatchContext& ctx);

  std::unique_ptr<Module> norm_1_, attn_, norm_2_, mlp_;
  // The norms as ResidualNorm when they are one (LayerNorm, RmsNorm): the residual adds around
  // them are then fused into their passes; nullptr: add_inplace, then the norm.
  ResidualNorm* residual_norm_1_ = nullptr;
  ResidualNorm* residual_norm_2_ = nullptr;
  bool full_recompute_;
  struct State {  // full recompute only: the block's input
    Tensor x;
    SequenceBatch batch{0, 0};
  };
  Saved<State> saved_;
};

}  // namespace meshtrain
