#include "meshtrain/transformer/attention.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/autocast.h"

namespace meshtrain {
namespace {

std::vector<ColumnWeight> qkv_weights(const std::string& prefix, const AttentionShape& s) {
  if (s.fused_qkv) return {{prefix + ".c_attn", s.init_std}};
  return {{prefix + ".q_proj", s.init_std},
          {prefix + ".k_proj", s.init_std},
          {prefix + ".v_proj", s.init_std}};
}

// The logical [out, in] of each projection `shape` implies: fused [3C, C], or q [H·d, C],
// k and v [Hkv·d, C], then the output projection [C, H·d].
std::vector<Shape> projection_shapes(const AttentionShape& s) {
  const std::int64_t C = s.n_embd, d = C / s.n_head;
  if (s.fused_qkv) return {{3 * C, C}, {C, C}};
  return {{s.n_head * d, C}, {s.n_kv_head * d, C}, {s.n_kv_head * d, C}, {C, s.n_head * d}};
}

// The rows of q, k and v inside the projection outputs: three column blocks of one tensor
// (fused c_attn, whose shard is [q heads | k heads | v heads] of this rank), or three tensors.
template <typename Ptr, typename Rows>
Rows rows_of(const std::vector<Tensor>& t, std::int64_t q_width, std::int64_t kv_width) {
  auto base = [](const Tensor& x) { return const_cast<Ptr>(x.f32()); };
  if (t.size() == 1) {
    Ptr p = base(t[0]);
    const std::int64_t stride = t[0].dim(1);
    return {p, p + q_width, p + q_width + kv_width, stride, stride};
  }
  return {base(t[0]), base(t[1]), base(t[2]), q_width, kv_width};
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const std::string& prefix, const AttentionShape& shape,
                                         const PlacementTable& records,
                                         const ParallelGroups& groups, RecomputeMode recompute,
                                         ParameterStorage storage)
    : shape_(shape),
      heads_(shape.n_head / groups.tp.group.size()),
      kv_heads_(shape.n_kv_head / groups.tp.group.size()),
      head_dim_(shape.n_embd / shape.n_head),
      recompute_core_(recompute == RecomputeMode::selective),
      cp_(groups.cp),
      qkv_(qkv_weights(prefix, shape), records, groups.tp, storage),
      out_(prefix + (shape.fused_qkv ? ".c_proj" : ".o_proj"), records, shape.proj_init_std,
           groups.tp, storage) {
  const TensorParallel& tp = groups.tp;
  std::vector<Shape> built;
  for (const Parameter* p : qkv_.parameters()) {
    if (p->shard.logical_shape.size() == 2) built.push_back(p->shard.logical_shape);
  }
  built.push_back(out_.parameters().front()->shard.logical_shape);
  MT_CHECK(built == projection_shapes(shape), "{}: projection records do not fit {} heads of {}",
           prefix, shape.n_head, shape.n_embd);
  MT_CHECK(shape.n_head % tp.group.size() == 0 && shape.n_kv_head % tp.group.size() == 0 &&
               shape.n_head % shape.n_kv_head == 0 &&
               (!shape.fused_qkv || shape.n_kv_head == shape.n_head),
           "{}: {} heads / {} kv heads cannot be split over {} ranks", prefix, shape.n_head,
           shape.n_kv_head, tp.group.size());
}

Tensor CausalSelfAttention::forward(const Tensor& x, const SequenceBatch& batch,
                                    const MicroBatchContext& ctx) {
  State& s = saved_.at(ctx.slot);
  s.batch = batch;
  s.qkv_out = qkv_.forward(x, ctx);
  s.core_operands = attention_operands(*qkv_.parameters().front());
  const std::int64_t tokens = s.qkv_out[0].dim(0);
  MT_CHECK(tokens == batch.tokens(), "attention input has {} rows, expected {} × {}", tokens,
           batch.sequences, batch.seq_len);
  const std::int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
  const auto in = rows_of<float*, kernels::QkvGradRows>(s.qkv_out, q_width, kv_width);
  if (shape_.rope_theta > 0.0f) {
    s.positions.resize(static_cast<std::size_t>(tokens));
    for (std::int64_t t = 0; t < tokens; ++t) {  // global positions of the zigzag rows
      s.positions[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(
          zigzag_position(t % batch.seq_len, batch.seq_len, cp_.rank(), cp_.size()));
    }
    kernels::rope_apply(in.dq, in.q_stride, s.positions.data(), tokens, heads_, head_dim_,
                        shape_.rope_theta, false);
    kernels::rope_apply(in.dk, in.kv_stride, s.positions.data(), tokens, kv_heads_, head_dim_,
                        shape_.rope_theta, false);
  }
  attend(s);
  Tensor y = out_.forward(s.att_out, ctx);
  if (recompute_core_) {
    // The output and lse are the only per-layer activations the core adds (the kernel never
    // stores the T×T scores); the output projection holds the output too, so both let go.
    s.att_out = Tensor();
    s.core = AttentionCoreState();
    out_.discard(ctx);
  }
  return y;
}

AttentionCoreShape CausalSelfAttention::core_shape(const State& s) const {
  return {s.batch.sequences, s.batch.seq_len, heads_, kv_heads_, head_dim_, s.core_operands};
}

void CausalSelfAttention::attend(State& s) {
  const std::int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
  s.att_out = Tensor::empty({s.batch.tokens(), q_width}, MemCategory::activations);
  s.core = attention_core_forward(
      cp_, rows_of<const float*, kernels::QkvRows>(s.qkv_out, q_width, kv_width), core_shape(s),
      s.att_out.f32(), core_compute_s_);
}

Tensor CausalSelfAttention::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  std::vector<Tensor> grads;
  {
    // Freed before the q/k/v projection's backward, with the attention-output gradient.
    State s = saved_.take(ctx.slot, parameters().front()->name);
    if (recompute_core_) {
      attend(s);  // the forward's kernel on the forward's q, k, v: the same bits
      out_.keep_input(s.att_out, ctx);
    }
    const Tensor d_att = out_.backward(dy, ctx);
    for (const Tensor& t : s.qkv_out)
      grads.push_back(Tensor::empty(t.shape(), MemCategory::activations));
    const std::int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
    const auto d = rows_of<float*, kernels::QkvGradRows>(grads, q_width, kv_width);
    attention_core_backward(
        cp_, rows_of<const float*, kernels::QkvRows>(s.qkv_out, q_width, kv_width), s.att_out.f32(),
        d_att.f32(), s.core, d, core_shape(s), core_compute_s_);
    if (shape_.rope_theta > 0.0f) {  // the rotation is orthogonal: its backward rotates back
      const std::int64_t tokens = s.qkv_out[0].dim(0);
      kernels::rope_apply(d.dq, d.q_stride, s.positions.data(), tokens, heads_, head_dim_,
                          shape_.rope_theta, true);
      kernels::rope_apply(d.dk, d.kv_stride, s.positions.data(), tokens, kv_heads_, head_dim_,
                          shape_.rope_theta, true);
    }
  }
  return qkv_.backward(grads, ctx);
}

void CausalSelfAttention::discard(const MicroBatchContext& ctx) {
  saved_.release(ctx.slot);
  qkv_.discard(ctx);
  out_.discard(ctx);
}

ParameterList CausalSelfAttention::parameters() {
  ParameterList out = qkv_.parameters();
  for (Parameter* p : out_.parameters()) out.push_back(p);
  return out;
}

}  // namespace meshtrain
