#include "meshtrain/layers/transformer_block.h"

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

TransformerBlock::TransformerBlock(const std::string& prefix, const AttentionShape& shape)
    : ln_1_(prefix + ".ln_1", shape.n_embd, shape.bias),
      attn_(prefix + ".attn", shape),
      ln_2_(prefix + ".ln_2", shape.n_embd, shape.bias),
      mlp_(prefix + ".mlp", shape.n_embd, shape.bias, shape.init_std, shape.proj_init_std) {}

Tensor TransformerBlock::forward(const Tensor& x, std::int64_t batch, std::int64_t seq_len) {
  Tensor h = attn_.forward(ln_1_.forward(x), batch, seq_len);
  kernels::add_inplace(h.f32(), x.f32(), h.numel());  // h = x + attn(ln_1(x))
  Tensor y = mlp_.forward(ln_2_.forward(h));
  kernels::add_inplace(y.f32(), h.f32(), y.numel());  // y = h + mlp(ln_2(h))
  return y;
}

Tensor TransformerBlock::backward(const Tensor& dy) {
  // The residual passes dy through unchanged, so each branch's dx adds onto it.
  Tensor dh = ln_2_.backward(mlp_.backward(dy));
  kernels::add_inplace(dh.f32(), dy.f32(), dh.numel());
  Tensor dx = ln_1_.backward(attn_.backward(dh));
  kernels::add_inplace(dx.f32(), dh.f32(), dx.numel());
  return dx;
}

ParameterList TransformerBlock::parameters() {
  ParameterList out;
  for (Parameter* p : ln_1_.parameters()) out.push_back(p);
  for (Parameter* p : attn_.parameters()) out.push_back(p);
  for (Parameter* p : ln_2_.parameters()) out.push_back(p);
  for (Parameter* p : mlp_.parameters()) out.push_back(p);
  return out;
}

}  // namespace meshtrain
