#include "meshtrain/layers/transformer_block.h"

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

TransformerBlock::TransformerBlock(std::unique_ptr<Module> norm_1, std::unique_ptr<Module> attn,
                                   std::unique_ptr<Module> norm_2, std::unique_ptr<Module> mlp,
                                   Recompute recompute)
    : norm_1_(std::move(norm_1)),
      attn_(std::move(attn)),
      norm_2_(std::move(norm_2)),
      mlp_(std::move(mlp)),
      full_recompute_(recompute == Recompute::full) {}

Tensor TransformerBlock::forward(const Tensor& x, const SequenceBatch& batch) {
  Tensor y = run(x, batch);
  if (full_recompute_) {
    for (Module* m : {norm_1_.get(), attn_.get(), norm_2_.get(), mlp_.get()}) m->discard();
    *saved_ = State{x, batch};
  }
  return y;
}

Tensor TransformerBlock::run(const Tensor& x, const SequenceBatch& batch) {
  Tensor h = attn_->forward(norm_1_->forward(x, batch), batch);
  kernels::add_inplace(h.f32(), x.f32(), h.numel());  // h = x + attn(norm_1(x))
  Tensor y = mlp_->forward(norm_2_->forward(h, batch), batch);
  kernels::add_inplace(y.f32(), h.f32(), y.numel());  // y = h + mlp(norm_2(h))
  return y;
}

Tensor TransformerBlock::backward(const Tensor& dy) {
  if (full_recompute_) {
    const State s = saved_.take("transformer block");
    run(s.x, s.batch);  // the parts keep their activations again; the output is not needed
  }
  // The residual passes dy through unchanged, so each branch's dx adds onto it.
  Tensor dh = norm_2_->backward(mlp_->backward(dy));
  kernels::add_inplace(dh.f32(), dy.f32(), dh.numel());
  Tensor dx = norm_1_->backward(attn_->backward(dh));
  kernels::add_inplace(dx.f32(), dh.f32(), dx.numel());
  return dx;
}

void TransformerBlock::discard() {
  saved_.release();
  for (Module* m : {norm_1_.get(), attn_.get(), norm_2_.get(), mlp_.get()}) m->discard();
}

ParameterList TransformerBlock::parameters() {
  ParameterList out;
  for (Module* m : {norm_1_.get(), attn_.get(), norm_2_.get(), mlp_.get()}) {
    for (Parameter* p : m->parameters()) out.push_back(p);
  }
  return out;
}

}  // namespace meshtrain
