// src/meshtrain/layers/attention.h — GPT-2 causal self-attention block part: c_attn (fused
// q, k, v projection), scaled dot-product attention with a causal mask, c_proj.
#pragma once

#include "meshtrain/layers/linear.h"

namespace meshtrain {

struct AttentionShape {
  std::int64_t n_embd;  // C
  std::int64_t n_head;  // heads; C % n_head == 0 (validated with the config)
  bool bias;
  float init_std;       // c_attn weights
  float proj_init_std;  // c_proj weights (GPT-2 scales it by 1/√(2·n_layer))
};

class CausalSelfAttention {
 public:
  /// Parameters `<prefix>.c_attn.{weight [3C, C], bias [3C]}`, `<prefix>.c_proj.{weight [C, C],
  /// bias [C]}` (Hugging Face GPT-2 names; weights in nn.Linear layout).
  CausalSelfAttention(const std::string& prefix, const AttentionShape& shape);

  /// x [batch·T, C] → [batch·T, C]. Keeps qkv, the attention output and its log-sum-exp.
  Tensor forward(const Tensor& x, std::int64_t batch, std::int64_t seq_len);
  /// dy [batch·T, C] → dx [batch·T, C]; accumulates parameter gradients.
  Tensor backward(const Tensor& dy);
  ParameterList parameters();

 private:
  AttentionShape shape_;
  Linear c_attn_, c_proj_;
  std::int64_t batch_ = 0, seq_len_ = 0;
  Tensor qkv_, att_out_, lse_;
};

}  // namespace meshtrain
