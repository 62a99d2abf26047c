// src/meshtrain/parallel/tp/vocab_parallel.h
//
// The vocabulary split over tp (Shoeybi et al. 2019, §3): the token embedding and the LM head
// hold rows [r·Vp/tp, (r+1)·Vp/tp) of the [V, C] table, Vp = V rounded up to a multiple of tp
// (their records' tp slices, even_shard). The padding rows sit at the end of the last ranks'
// shards: they are zero, no id ever looks them up, their logits never enter the softmax, so
// they get no gradient and are not part of the logical parameter (Megatron-LM pads to a multiple of 128·tp; the minimal
// padding here keeps the logical tensor exactly the unsharded one). Full logits [tokens, V] are
// never gathered for the loss: the cross-entropy combines per-shard max, Σexp and the target
// logit with three small all-reduces (Megatron-LM's VocabParallelCrossEntropy).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/parameter.h"
#include "meshtrain/parallel/tp/tp_regions.h"

namespace meshtrain {

/// The [V, C] table parameter of `record` (sharded over tp along dim 0) as this rank's padded
/// shard [ceil(V/tp), C], N(0, std²).
Parameter vocab_shard_parameter(const ParamPlacement& record, float init_std,
                                const ProcessGroup& tp,
                                ParameterStorage storage = ParameterStorage::allocated);

class VocabParallelEmbedding {
 public:
  /// The table of `record` (vocab_shard_parameter).
  VocabParallelEmbedding(const ParamPlacement& record, float init_std, const TensorParallel& tp,
                         ParameterStorage storage = ParameterStorage::allocated);

  /// ids [tokens] i32 in [0, V), the same on every tp rank → [tokens, C], or this rank's rows
  /// [tokens/tp, C] under sequence parallelism: each rank looks up the ids of its shard (zero
  /// rows for the others) and the partial sums leave through ExitTpRegion. Keeps a copy of
  /// the ids in slot ctx.slot.
  Tensor forward(const std::int32_t* ids, std::int64_t tokens, const MicroBatchContext& ctx);
  /// Drops what slot ctx.slot's forward kept (a forward with no backward).
  void discard(const MicroBatchContext& ctx) { saved_.release(ctx.slot); }
  /// dy in forward's output layout; accumulates the shard's gradient at once (also when ctx
  /// names a weight-gradient queue: a lookup's backward is a cheap scatter-add) and frees the
  /// slot's ids.
  void backward(const Tensor& dy, const MicroBatchContext& ctx);
  Parameter& weight() { return weight_; }
  const Parameter& weight() const { return weight_; }

 private:
  TensorParallel tp_;
  Parameter weight_;
  struct State {
    std::vector<std::int32_t> ids;
  };
  Saved<State> saved_;
};

/// The LM head over a vocabulary-sharded weight (its own, or the tied token embedding) and the
/// mean softmax cross-entropy. The weight's shard slice says which ids it holds.
class VocabParallelLmHead {
 public:
  VocabParallelLmHead(Parameter& weight, const TensorParallel& tp);

  /// h [tokens, C] (or [tokens/tp, C] under sequence parallelism), targets [tokens] in [0, V)
  /// → mean cross-entropy over the tokens, the same number on every tp rank. Keeps, in slot
  /// ctx.slot, the entered h [tokens, C] (rounded to the weight's dtype when it is 16-bit),
  /// the local logits [tokens, Vp/tp] f32, their log-sum-exp [tokens] and the targets.
  float forward(const Tensor& h, const std::int32_t* targets, const MicroBatchContext& ctx);
  /// Backward of `scale` × the slot's forward loss → dh in h's layout; accumulates the
  /// weight's gradient (real rows only), or queues it in ctx's weight-gradient queue when it
  /// names one (the queue then keeps h and the logits' gradient, which overwrote the logits,
  /// until W). Frees the slot's state.
  Tensor backward(float scale, const MicroBatchContext& ctx);
  /// Drops what slot ctx.slot's forward kept (a forward with no backward).
  void discard(const MicroBatchContext& ctx) { saved_.release(ctx.slot); }
  /// h as in forward → full logits [tokens, V] on every rank (gathered over tp, padding
  /// dropped). For sampling and tests; nothing kept for backward.
  Tensor logits(const Tensor& h);

 private:
  /// h_in [tokens, C] = matmul_input(entered h, weight_) → logits [tokens, Vp/tp] f32.
  Tensor local_logits(const Tensor& h_in) const;

  Parameter& weight_;
  TensorParallel tp_;
  struct State {
    Tensor h_full, logits, lse;  // h_full: matmul_input of the entered h
    std::vector<std::int32_t> targets;
  };
  Saved<State> saved_;
};

}  // namespace meshtrain
