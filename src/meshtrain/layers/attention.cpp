#include "meshtrain/layers/attention.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

CausalSelfAttention::CausalSelfAttention(const std::string& prefix, const AttentionShape& shape)
    : shape_(shape),
      c_attn_(prefix + ".c_attn", shape.n_embd, 3 * shape.n_embd, shape.bias, shape.init_std),
      c_proj_(prefix + ".c_proj", shape.n_embd, shape.n_embd, shape.bias, shape.proj_init_std) {}

Tensor CausalSelfAttention::forward(const Tensor& x, std::int64_t batch, std::int64_t seq_len) {
  MT_CHECK(x.dim(0) == batch * seq_len, "attention input has {} rows, expected {} × {}", x.dim(0),
           batch, seq_len);
  batch_ = batch;
  seq_len_ = seq_len;
  qkv_ = c_attn_.forward(x);
  att_out_ = Tensor::empty({x.dim(0), shape_.n_embd}, MemCategory::activations);
  lse_ = Tensor::empty({batch, shape_.n_head, seq_len}, MemCategory::activations);
  kernels::attention_forward(qkv_.f32(), att_out_.f32(), lse_.f32(),
                             {batch, seq_len, shape_.n_head, shape_.n_embd / shape_.n_head});
  return c_proj_.forward(att_out_);
}

Tensor CausalSelfAttention::backward(const Tensor& dy) {
  const Tensor d_att_out = c_proj_.backward(dy);
  Tensor dqkv = Tensor::empty(qkv_.shape(), MemCategory::activations);
  kernels::attention_backward(qkv_.f32(), att_out_.f32(), lse_.f32(), d_att_out.f32(), dqkv.f32(),
                              {batch_, seq_len_, shape_.n_head, shape_.n_embd / shape_.n_head});
  qkv_ = att_out_ = lse_ = Tensor();
  return c_attn_.backward(dqkv);
}

ParameterList CausalSelfAttention::parameters() {
  ParameterList out = c_attn_.parameters();
  for (Parameter* p : c_proj_.parameters()) out.push_back(p);
  return out;
}

}  // namespace meshtrain
