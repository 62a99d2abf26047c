#include "meshtrain/parallel/tp/vocab_parallel.h"

#include <cmath>
#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/autocast.h"
#include "meshtrain/layers/weight_grad_queue.h"

namespace meshtrain {

Parameter vocab_shard_parameter(const ParamPlacement& record, float init_std,
                                const ProcessGroup& tp, ParameterStorage storage) {
  MT_CHECK(record.shape.size() == 2 && record.sharded_over_tp() && record.on(Axis::tp).dim == 0,
           "{}: a vocabulary table is [V, C] sharded over tp along V, not {} {}", record.name,
           to_string(record.shape), to_string(record.on(Axis::tp)));
  return Parameter(record, tp.rank(), tp.size(), InitKind::normal, init_std, storage);
}

VocabParallelEmbedding::VocabParallelEmbedding(const ParamPlacement& record, float init_std,
                                               const TensorParallel& tp, ParameterStorage storage)
    : tp_(tp), weight_(vocab_shard_parameter(record, init_std, tp.group, storage)) {}

Tensor VocabParallelEmbedding::forward(const std::int32_t* ids, std::int64_t tokens,
                                       const MicroBatchContext& ctx) {
  const std::int64_t C = weight_.value.dim(1);
  saved_.at(ctx.slot).ids.assign(ids, ids + tokens);
  Tensor partial = Tensor::empty({tokens, C}, MemCategory::activations);
  embedding_lookup(ids, weight_.value, weight_.shard.offset, weight_.shard.length, partial.f32(),
                   tokens);
  return ExitTpRegion::forward(partial, tp_);
}

void VocabParallelEmbedding::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  const std::vector<std::int32_t> ids = saved_.take(ctx.slot, weight_.name).ids;
  const Tensor dy_full = ExitTpRegion::backward(dy, tp_);
  const std::int64_t tokens = static_cast<std::int64_t>(ids.size());
  MT_CHECK(dy_full.dim(0) == tokens, "{}: grad {} for {} tokens", weight_.name,
           to_string(dy_full.shape()), tokens);
  kernels::embedding_shard_backward(ids.data(), dy_full.f32(), weight_.shard.offset,
                                    weight_.shard.length, weight_.grad.f32(), tokens,
                                    dy_full.dim(1));
}

VocabParallelLmHead::VocabParallelLmHead(Parameter& weight, const TensorParallel& tp)
    : weight_(weight), tp_(tp) {}

Tensor VocabParallelLmHead::local_logits(const Tensor& h_in) const {
  MT_CHECK(h_in.ndim() == 2 && h_in.dim(1) == weight_.value.dim(1),
           "{}: hidden {} expected [tokens, {}]", weight_.name, to_string(h_in.shape()),
           weight_.value.dim(1));
  Tensor logits = Tensor::empty({h_in.dim(0), weight_.value.dim(0)}, MemCategory::activations);
  autocast_linear_forward(h_in, weight_, nullptr, logits);
  return logits;
}

float VocabParallelLmHead::forward(const Tensor& h, const std::int32_t* targets,
                                   const MicroBatchContext& ctx) {
  State& s = saved_.at(ctx.slot);
  s.h_full = matmul_input(EnterTpRegion::forward(h, tp_), weight_);
  s.logits = local_logits(s.h_full);
  const std::int64_t tokens = s.logits.dim(0), v_local = s.logits.dim(1);
  const std::int64_t vocab = weight_.shard.logical_shape[0];
  for (std::int64_t i = 0; i < tokens; ++i) {
    MT_CHECK(targets[i] >= 0 && targets[i] < vocab, "target {} at {} outside vocab {}", targets[i],
             i, vocab);
  }
  s.targets.assign(targets, targets + tokens);
  const std::int64_t first = weight_.shard.offset, valid = weight_.shard.length;
  // lse = max + log Σ exp(z − max) over the whole vocabulary: the max first (all-reduce max),
  // then Σ exp and the target's logit (zero on every rank but its owner) in one all-reduce sum.
  s.lse = Tensor::empty({tokens}, MemCategory::activations);
  Tensor sums = Tensor::empty({2, tokens}, MemCategory::activations);
  float* sum_exp = sums.f32();
  float* target_logit = sums.f32() + tokens;
  if (tp_.group.size() == 1 && valid == v_local && first == 0) {
    // The whole vocabulary here: max, Σ exp and the target in one pass (no reductions).
    kernels::vocab_softmax_stats(s.logits.f32(), targets, tokens, v_local, s.lse.f32(), sum_exp,
                                 target_logit);
  } else {
    kernels::vocab_shard_max(s.logits.f32(), tokens, v_local, valid, s.lse.f32());
    tp_.group.all_reduce_max(s.lse.span_f32());
    kernels::vocab_shard_sum_exp(s.logits.f32(), s.lse.f32(), targets, first, tokens, v_local,
                                 valid, sum_exp, target_logit);
    tp_.group.all_reduce_sum(sums.span_f32());
  }
  double loss_sum = 0.0;
  float* lse = s.lse.f32();
  for (std::int64_t i = 0; i < tokens; ++i) {
    lse[i] += std::log(sum_exp[i]);
    loss_sum += static_cast<double>(lse[i] - target_logit[i]);
  }
  return static_cast<float>(loss_sum / static_cast<double>(tokens));
}

Tensor VocabParallelLmHead::backward(float scale, const MicroBatchContext& ctx) {
  State s = saved_.take(ctx.slot, weight_.name);
  const std::int64_t tokens = s.logits.dim(0), v_local = s.logits.dim(1);
  const std::int64_t C = s.h_full.dim(1);
  // dlogits overwrites the logits: nothing reads them after this. Padding columns get 0, so
  // the padding rows of the weight get no gradient.
  kernels::vocab_shard_cross_entropy_backward(
      s.logits.f32(), s.lse.f32(), s.targets.data(), weight_.shard.offset,
      scale / static_cast<float>(tokens), s.logits.f32(), tokens, v_local, weight_.shard.length);
  Tensor dh = Tensor::empty(s.h_full.shape(), MemCategory::activations);
  linear_backward_or_defer(s.h_full, weight_, s.logits, dh.f32(), nullptr, {tokens, C, v_local},
                           ctx);
  s = State();  // freed before the region's backward, unless a W task keeps h and dlogits
  return EnterTpRegion::backward(dh, tp_);
}

Tensor VocabParallelLmHead::logits(const Tensor& h) {
  const Tensor local = local_logits(matmul_input(EnterTpRegion::forward(h, tp_), weight_));
  const std::int64_t tokens = local.dim(0), v_local = local.dim(1);
  const std::int64_t vocab = weight_.shard.logical_shape[0];
  const int n = tp_.group.size();
  Tensor gathered = local;
  if (n > 1) {
    gathered = Tensor::empty({n, tokens, v_local}, MemCategory::activations);
    tp_.group.all_gather(local.span_f32(), gathered.span_f32());
  }
  // Rank r's shard holds ids [r·v_local, ...): place its real columns, drop the padding.
  Tensor out = Tensor::empty({tokens, vocab}, MemCategory::activations);
  for (int r = 0; r < n; ++r) {
    const std::int64_t first = std::min<std::int64_t>(r * v_local, vocab);
    const std::int64_t valid = std::min(v_local, vocab - first);
    for (std::int64_t t = 0; t < tokens && valid > 0; ++t) {
      std::memcpy(out.f32() + t * vocab + first, gathered.f32() + (r * tokens + t) * v_local,
                  static_cast<std::size_t>(valid) * sizeof(float));
    }
  }
  return out;
}

}  // namespace meshtrain
