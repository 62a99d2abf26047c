// src/meshtrain/layers/transformer_block.h — pre-LayerNorm GPT-2 block (Radford et al. 2019,
// §2.3): x + attn(ln_1(x)), then + mlp(ln_2(·)).
#pragma once

#include "meshtrain/layers/attention.h"
#include "meshtrain/layers/layer_norm.h"
#include "meshtrain/layers/mlp.h"

namespace meshtrain {

class TransformerBlock {
 public:
  /// Parameters under `<prefix>.{ln_1, attn, ln_2, mlp}` (Hugging Face GPT-2 names).
  TransformerBlock(const std::string& prefix, const AttentionShape& shape);

  /// x [batch·T, C] → [batch·T, C].
  Tensor forward(const Tensor& x, std::int64_t batch, std::int64_t seq_len);
  /// dy [batch·T, C] → dx [batch·T, C].
  Tensor backward(const Tensor& dy);
  ParameterList parameters();

 private:
  LayerNorm ln_1_;
  CausalSelfAttention attn_;
  LayerNorm ln_2_;
  Mlp mlp_;
};

}  // namespace meshtrain
