// src/meshtrain/parallel/dp/grad_buckets.h
//
// Averages parameter gradients over the data-parallel group with a bucketed all-reduce (the
// bucketing of PyTorch DDP, Li et al. 2020, "PyTorch Distributed", §3.2.3): gradients live in
// flat buckets of at most `bucket_bytes` — each Parameter::grad becomes a view into its
// bucket, as DDP's gradient-as-bucket-view, so reducing needs no copy in or out — and each
// bucket is all-reduced as one message, then divided by dp. Buckets are filled in reverse parameter
// order because backward produces the last layer's gradients first, so a later version can put the
// first bucket on the wire while earlier layers still compute. Every dp rank builds the same
// buckets in the same order (the order depends only on the parameter list, never on timing), or the
// all-reduces would pair up wrongly. Called once per optimizer step, after all micro-batches: one
// reduction per step whatever the accumulation. Uses: comm/process_group.h, layers/parameter.h.
// Knows nothing of pipeline stages or optimizers.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

class GradBuckets {
 public:
  /// Plans buckets over `params` (a parameter larger than bucket_bytes gets a bucket of its
  /// own; ProcessGroup chunks large messages). When dp.size() > 1, frees the parameters' own
  /// gradients, allocates each bucket once (MemCategory::grads, zeroed) and re-points every
  /// grad to its view of the bucket. Gradients must still be zero (built before any backward;
  /// MT_CHECK) or not allocated (DeferParameterStorage). With dp = 1 nothing changes.
  GradBuckets(const ParameterList& params, ProcessGroup& dp, std::int64_t bucket_bytes);

  /// Every grad ← mean over dp ranks of grad. No-op for a group of one rank.
  void all_reduce_mean();

  std::size_t num_buckets() const noexcept { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<Parameter*> params;
    Tensor buffer;  // [Σ numel] f32: the grads of `params`, back to back
  };
  ProcessGroup& dp_;
  std::vector<Bucket> buckets_;
};

}  // namespace meshtrain
