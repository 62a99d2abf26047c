// src/meshtrain/layers/norms.h — the two normalisations over features: LayerNorm (Ba et al.
// 2016; GPT-2, eps 1e-5 as PyTorch's default) and RMSNorm (Zhang & Sennrich 2019; Llama).
// Their weights (and LayerNorm's bias) are replicated over tp; under sequence parallelism each
// rank normalises its own token rows, so their gradients are partial sums over its tokens
// that the trainer sums over tp once per step.
#pragma once

#include <optional>
#include <string>

#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/module.h"

namespace meshtrain {

/// A norm that also takes the residual add in front of it (the pre-norm block's
/// h = x + attn(·), then norm_2(h); TransformerBlock): one pass over the rows instead of
/// add_inplace then the norm, bitwise equal to them
/// (tests/unit/kernels/fused_kernels_test.cpp).
class ResidualNorm : public Module {
 public:
  /// branch, x [rows, C]: branch becomes h = branch + x in place (the residual stream), and the
  /// norm of h is returned; keeps what forward() keeps.
  virtual Tensor forward_residual(Tensor& branch, const Tensor& x,
                                  const MicroBatchContext& ctx) = 0;
  /// backward(dy) + d_residual [rows, C]: the residual stream's gradient added to the norm's
  /// input gradient in the same pass.
  virtual Tensor backward_residual(const Tensor& dy, const Tensor& d_residual,
                                   const MicroBatchContext& ctx) = 0;
};

class LayerNorm final : public ResidualNorm {
 public:
  /// `<prefix>.weight` [C] = 1 and, when `records` lists it, `<prefix>.bias` [C] = 0, each
  /// allocated from its record (replicated over tp; MT_CHECKed).
  LayerNorm(const std::string& prefix, const PlacementTable& records, float eps,
            ParameterStorage storage = ParameterStorage::allocated);

  /// x [rows, C] → [rows, C]; keeps x, mean and rstd [rows] in slot ctx.slot.
  Tensor forward(const Tensor& x, const SequenceBatch& batch,
                 const MicroBatchContext& ctx) override;
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) override;
  Tensor forward_residual(Tensor& branch, const Tensor& x, const MicroBatchContext& ctx) override;
  Tensor backward_residual(const Tensor& dy, const Tensor& d_residual,
                           const MicroBatchContext& ctx) override;
  ParameterList parameters() override;
  void discard(const MicroBatchContext& ctx) override { saved_.release(ctx.slot); }

 private:
  std::int64_t features_;
  float eps_;
  Parameter weight_;
  std::optional<Parameter> bias_;
  Tensor run_forward(const Tensor& x, Tensor* branch, const MicroBatchContext& ctx);
  Tensor run_backward(const Tensor& dy, const Tensor* d_residual, const MicroBatchContext& ctx);
  struct State {
    Tensor x, mean, rstd;
  };
  Saved<State> saved_;
};

class RmsNorm final : public ResidualNorm {
 public:
  /// `<prefix>.weight` [C] = 1 (Hugging Face LlamaRMSNorm), allocated from its record
  /// (replicated over tp; MT_CHECKed).
  RmsNorm(const std::string& prefix, const PlacementTable& records, float eps,
          ParameterStorage storage = ParameterStorage::allocated);

  /// x [rows, C] → [rows, C]; keeps x and rstd [rows] in slot ctx.slot.
  Tensor forward(const Tensor& x, const SequenceBatch& batch,
                 const MicroBatchContext& ctx) override;
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) override;
  Tensor forward_residual(Tensor& branch, const Tensor& x, const MicroBatchContext& ctx) override;
  Tensor backward_residual(const Tensor& dy, const Tensor& d_residual,
                           const MicroBatchContext& ctx) override;
  ParameterList parameters() override;
  void discard(const MicroBatchContext& ctx) override { saved_.release(ctx.slot); }

 private:
  std::int64_t features_;
  float eps_;
  Parameter weight_;
  Tensor run_forward(const Tensor& x, Tensor* branch, const MicroBatchContext& ctx);
  Tensor run_backward(const Tensor& dy, const Tensor* d_residual, const MicroBatchContext& ctx);
  struct State {
    Tensor x, rstd;
  };
  Saved<State> saved_;
};

}  // namespace meshtrain
