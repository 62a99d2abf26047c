#include "meshtrain/transformer/transformer_block.h"

#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/norms.h"

namespace meshtrain {
namespace {

// norm.backward(dy) + d_residual: fused when the norm is a ResidualNorm.
Tensor norm_backward(Module* norm, ResidualNorm* fused, const Tensor& dy, const Tensor& d_residual,
                     const MicroBatchContext& ctx) {
  if (fused != nullptr) return fused->backward_residual(dy, d_residual, ctx);
  Tensor dx = norm->backward(dy, ctx);
  kernels::add_inplace(dx.f32(), d_residual.f32(), dx.numel());
  return dx;
}

}  // namespace

TransformerBlock::TransformerBlock(std::unique_ptr<Module> norm_1, std::unique_ptr<Module> attn,
                                   std::unique_ptr<Module> norm_2, std::unique_ptr<Module> mlp,
                                   RecomputeMode recompute)
    : norm_1_(std::move(norm_1)),
      attn_(std::move(attn)),
      norm_2_(std::move(norm_2)),
      mlp_(std::move(mlp)),
      full_recompute_(recompute == RecomputeMode::full) {
  residual_norm_1_ = dynamic_cast<ResidualNorm*>(norm_1_.get());
  residual_norm_2_ = dynamic_cast<ResidualNorm*>(norm_2_.get());
}

Tensor TransformerBlock::forward(const Tensor& x, const SequenceBatch& batch,
                                 const MicroBatchContext& ctx) {
  Tensor y = run(x, batch, ctx);
  if (full_recompute_) {
    for (Module* m : {norm_1_.get(), attn_.get(), norm_2_.get(), mlp_.get()}) m->discard(ctx);
    saved_.at(ctx.slot) = State{x, batch};
  }
  return y;
}

Tensor TransformerBlock::run(const Tensor& x, const SequenceBatch& batch,
                             const MicroBatchContext& ctx) {
  Tensor h = attn_->forward(norm_1_->forward(x, batch, ctx), batch, ctx);
  Tensor normed;
  if (residual_norm_2_ != nullptr) {
    normed = residual_norm_2_->forward_residual(h, x, ctx);  // h = x + attn(norm_1(x)), in the norm
  } else {
    kernels::add_inplace(h.f32(), x.f32(), h.numel());  // h = x + attn(norm_1(x))
    normed = norm_2_->forward(h, batch, ctx);
  }
  Tensor y = mlp_->forward(normed, batch, ctx);
  kernels::add_inplace(y.f32(), h.f32(), y.numel());  // y = h + mlp(norm_2(h))
  return y;
}

Tensor TransformerBlock::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  if (full_recompute_) {
    const State s = saved_.take(ctx.slot, "transformer block");
    run(s.x, s.batch, ctx);  // the parts keep their activations again; the output is not needed
  }
  // The residual passes dy through unchanged, so each branch's dx adds onto it (inside the
  // norm's backward pass when the norm is a ResidualNorm).
  const Tensor d_mlp = mlp_->backward(dy, ctx);
  const Tensor dh = norm_backward(norm_2_.get(), residual_norm_2_, d_mlp, dy, ctx);
  const Tensor d_attn = attn_->backward(dh, ctx);
  return norm_backward(norm_1_.get(), residual_norm_1_, d_attn, dh, ctx);
}

void TransformerBlock::discard(const MicroBatchContext& ctx) {
  saved_.release(ctx.slot);
  for (Module* m : {norm_1_.get(), attn_.get(), norm_2_.get(), mlp_.get()}) m->discard(ctx);
}

ParameterList TransformerBlock::parameters() {
  ParameterList out;
  for (Module* m : {norm_1_.get(), attn_.get(), norm_2_.get(), mlp_.get()}) {
    for (Parameter* p : m->parameters()) out.push_back(p);
  }
  return out;
}

}  // namespace meshtrain
