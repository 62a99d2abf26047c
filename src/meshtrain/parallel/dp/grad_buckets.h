// src/meshtrain/parallel/dp/grad_buckets.h
//
// Averages parameter gradients over the data-parallel group with a bucketed all-reduce (the
// bucketing of PyTorch DDP, Li et al. 2020, "PyTorch Distributed", §3.2.3): gradients live in
// flat buckets of at most `bucket_bytes` — each Parameter::grad becomes a view into its
// bucket, as DDP's gradient-as-bucket-view, so reducing needs no copy in or out — and each
// bucket is all-reduced as one message, then divided by dp. Buckets are filled in reverse
// parameter order because backward produces the last layer's gradients first.
//
// Overlap (parallel.overlap_grad_reduce; Megatron-LM's overlap_grad_reduce, DDP §3.2.3): the
// model reports each parameter's finished backward contributions (grad_ready, from the
// after-backward hook of its unit); once every parameter of a bucket has had its last one of
// the step — units × micro-batches contributions, so under gradient accumulation or a pipeline
// only the last micro-batch's backward launches — the bucket's non-blocking all-reduce is
// posted while earlier layers still compute, and progress() (called between layers) lets MPI
// move it forward. all_reduce_mean() then posts the buckets still unposted and waits for all.
// Without overlap every bucket is posted and waited for there, one after the other. Both
// paths use the same non-blocking all-reduce on the same buffers, so the reduced gradients are
// bitwise the same whichever is chosen and whenever a bucket is posted.
//
// Each bucket's gradients are checked for a non-finite value, when a watch is given
// (layers/non_finite_grads.h): after the all-reduce every rank would hold it. A bucket in plain
// memory is read before its all-reduce is posted; one in a shared-memory window is checked by
// the all-reduce itself as it sums it, and the request's report is noted after the wait.
//
// Every dp rank builds the same buckets and posts them in the same order (the order depends
// only on the parameter list and the backward order of units, never on timing), or the
// all-reduces would pair up wrongly. Uses: comm/process_group.h, layers/parameter.h. Knows
// nothing of pipeline stages or optimizers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/non_finite_grads.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

class GradBuckets {
 public:
  /// Plans buckets over `params` (a parameter larger than bucket_bytes gets a bucket of its
  /// own; ProcessGroup chunks large messages). When dp.size() > 1, frees the parameters' own
  /// gradients, allocates each bucket once (MemCategory::grads, zeroed) and re-points every
  /// grad to its view of the bucket. Gradients must still be zero (built before any backward;
  /// MT_CHECK) or not allocated (ParameterStorage::deferred). With dp = 1 nothing changes.
  /// `watch` (may be null) checks each bucket as it is posted, or notes what its shared-window
  /// all-reduce reported when it completes.
  GradBuckets(const ParameterList& params, ProcessGroup& dp, std::int64_t bucket_bytes,
              NonFiniteGradWatch* watch = nullptr);

  /// Turns overlap on: parameter p's gradient is final for the step after `passes(p)`
  /// grad_ready(p) calls (its units × the step's micro-batches). A parameter with 0 passes
  /// (in no unit) keeps its bucket for all_reduce_mean(). Call before the first backward.
  void enable_overlap(const std::function<int(const Parameter&)>& passes);
  bool overlap() const noexcept { return overlap_; }

  /// One backward contribution to p's gradient is complete (overlap only; otherwise nothing
  /// happens). Posts p's bucket when this was the last contribution of the step for every
  /// parameter in it. MT_CHECKs that p's bucket is not already in flight (a contribution
  /// after the post would race with the transfer).
  void grad_ready(const Parameter& p);
  /// Tests the buckets in flight, so that MPI progresses them (never blocks).
  void progress();

  /// Every grad ← mean over dp ranks of grad: posts the buckets not posted yet (in bucket
  /// order) and waits for all, and starts the next step's counts. The 1/dp is the all-reduce's
  /// scale (ProcessGroup::iall_reduce_sum), taken as each sum is stored over a shared window.
  /// No-op for a group of one rank.
  void all_reduce_mean();

  std::size_t num_buckets() const noexcept { return buckets_.size(); }
  /// Buckets the last all_reduce_mean() found already posted during backward.
  std::size_t posted_in_backward() const noexcept { return posted_in_backward_; }

 private:
  struct Bucket {
    std::vector<Parameter*> params;
    Tensor buffer;                         // [Σ numel] f32: the grads of `params`, back to back
    bool shared = false;  // buffer from allocate_shared: its all-reduce checks its inputs
    std::unique_ptr<CommRequest> request;  // in flight (or done, not yet waited for)
    int tracked = 0;  // parameters with passes > 0 (overlap); all of them: may post early
    int waiting = 0;  // of them, still short of their last contribution this step
  };
  struct Track {
    std::size_t bucket = 0;
    int passes = 0;  // contributions per step
    int done = 0;    // this step so far
  };
  void post(Bucket& bucket);
  /// Hands a completed shared bucket's first non-finite input (if any) to the watch.
  void note_non_finite_input(const Bucket& bucket);

  ProcessGroup& dp_;
  NonFiniteGradWatch* watch_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, Track> tracks_;
  bool overlap_ = false;
  std::size_t posted_in_backward_ = 0;
};

}  // namespace meshtrain
