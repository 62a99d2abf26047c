// src/meshtrain/parallel/tp/replicated_grads.h
//
// Under sequence parallelism (Korthikanti et al. 2022, §4.2.2) the parameters replicated over
// tp — norm weights and biases, row-parallel biases, GPT-2's position table — act on this
// rank's token rows only, so each rank's gradient is a partial sum over its tokens. Summing
// them over tp (one all-reduce per optimizer step, after gradient accumulation: the sum is
// linear) gives every rank the full gradient, bit-identical across the group, so the copies
// stay identical after the update (Megatron-LM's allreduce of sequence-parallel grads).
// Without sequence parallelism those gradients are already complete and identical: nothing
// to do. Each rank's partial sums are checked for a non-finite value as they are packed (when
// a watch is given, layers/non_finite_grads.h): after the sum every tp rank holds it.
// Uses: comm/process_group.h, layers/parameter.h.
#pragma once

#include <cstdint>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/non_finite_grads.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

class ReplicatedGradSum {
 public:
  /// Picks the optimizer shards whose placement sums them over tp (ParamPlacement::sum_over_tp:
  /// replicated over tp, under sequence parallelism, tp > 1) and allocates the flat buffer
  /// once (MemCategory::comm). Works on the shards' gradients, so under ZeRO each
  /// rank sums only its dp slice (every tp rank of a dp rank owns the same slice). `watch`
  /// (may be null) checks the partial sums before each all-reduce.
  ReplicatedGradSum(const OptimizerShards& shards, ProcessGroup& tp,
                    NonFiniteGradWatch* watch = nullptr);

  /// grad ← Σ over tp ranks of grad for every picked shard: one all-reduce of bytes().
  void all_reduce();
  /// Bytes of the all-reduce (0 when there is nothing to do).
  std::int64_t bytes() const noexcept { return buffer_.defined() ? buffer_.bytes() : 0; }

 private:
  ProcessGroup& tp_;
  NonFiniteGradWatch* watch_;
  std::vector<OptimizerShard> picked_;  // handles: their grads are views of the shards'
  Tensor buffer_;
};

}  // namespace meshtrain
