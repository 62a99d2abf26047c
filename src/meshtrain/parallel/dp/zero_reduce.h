// src/meshtrain/parallel/dp/zero_reduce.h
//
// The gradient reduce-scatters of ZeRO stages 1–3 (zero.h), with or without overlapping
// backward (parallel.overlap_grad_reduce; Megatron-LM's overlap_grad_reduce for its
// distributed optimizer). Each reduce-scatter packs the full fp32 gradients of some
// parameters rank-major into a slot's input buffer ([rank][parameter slice], padding zeroed),
// posts ProcessGroup::ireduce_scatter_sum, and when it completes writes (stage 1) or adds
// (stages 2, 3, every micro-batch) 1/N of the dp sum into this rank's gradient slices.
//   stage 1  buckets of consecutive parameters (≤ bucket_bytes of input each), once per step.
//            With overlap a bucket is posted as soon as every parameter in it has had its last
//            backward contribution of the step (the after-backward hooks of its units on the
//            last micro-batch: GradBuckets' rule), else all after backward, in bucket order.
//   stage ≥2 the parameters a unit's backward completed, every micro-batch, from its hook.
// Without overlap each reduce-scatter is waited for where it is posted (one at a time, as a
// blocking call); with overlap up to kInFlight stay in flight while backward goes on, test()ed
// between units, and the oldest is waited for when a further one needs its slot. Results are
// applied in posting order either way, and each element's sum is the ring's fixed-order sum
// over the ranks (comm/process_group.h), so overlap on and off give bitwise the same
// gradients. Every dp rank posts and waits at the same points (they depend on the parameter
// list and the order of the hooks, never on timing), as the ring requires.
// Each rank's gradients are checked for a non-finite value as they are packed (when a watch is
// given, layers/non_finite_grads.h): after the reduce-scatter the owner of the slice would hold it.
// Memory (docs/memory.md, MemCategory::comm): one slot (input N·Σs, output Σs fp32 elements
// of the largest bucket or unit) without overlap, up to kInFlight with it; slot 0 also serves
// ZeroSharding's all-gathers between steps.
// Uses: comm/process_group.h, layers/parameter.h.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/non_finite_grads.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// One parameter in a gradient reduce-scatter.
struct SlicedGrad {
  const Parameter* param = nullptr;  // param->grad: its full fp32 gradient, read when posted
  std::int64_t numel = 0;            // elements of the flattened local tensor
  std::int64_t slice = 0;            // s: elements per rank in the buffers (zero_slice)
  Tensor owned;  // f32 [min((r+1)·s, numel) − min(r·s, numel)]: this rank's slice of the result
};

class ZeroGradReducer {
 public:
  /// Reduce-scatters with overlap that may be in flight at once (double buffering).
  static constexpr std::size_t kInFlight = 2;

  /// `watch` (may be null) checks the gradients each reduce-scatter packs.
  ZeroGradReducer(ProcessGroup& dp, bool overlap, NonFiniteGradWatch* watch = nullptr)
      : dp_(dp), overlap_(overlap), watch_(watch) {}

  /// Stage 1: plans the buckets over `grads` (in order; a bucket closes before a parameter
  /// that would take its input beyond bucket_bytes). With overlap, p's gradient is final for
  /// the step after passes(p) grad_ready(p) calls (its units × micro-batches); a bucket holding
  /// a parameter of 0 passes waits for post_remaining_buckets().
  void plan_buckets(std::vector<SlicedGrad> grads, std::int64_t bucket_bytes,
                    const std::function<int(const Parameter&)>& passes);
  /// Stage 1 with overlap: one backward contribution to p's gradient is complete; posts p's
  /// bucket after the last one of the step of all its parameters. MT_CHECKs that the bucket
  /// was not posted yet (a contribution after the post would be lost). Otherwise nothing.
  void grad_ready(const Parameter& p);
  /// Stage 1 after backward: posts the buckets not yet posted, in bucket order.
  void post_remaining_buckets();

  /// Stages 2 and 3, from a unit's after-backward hook: reduce-scatters the full gradients
  /// (p.grad) of `grads`, adding the result into their slices. p.grad may be freed on return.
  void post_unit(std::vector<SlicedGrad> grads);

  /// Tests the reduce-scatters in flight so that their rings move on (never blocks).
  void progress();
  /// End of the step's backward: waits for every reduce-scatter in flight and applies them in
  /// posting order; records posted_in_backward() and starts the next step's counts.
  void finish_step();
  /// Reduce-scatters of the last finished step that were posted during backward and left in
  /// flight there (overlap); 0 without overlap.
  std::size_t posted_in_backward() const noexcept { return posted_in_backward_; }

  /// For all-gathers between steps: slot 0's input (which = 0) or output (1) buffer, grown to
  /// at least `words` 4-byte words. MT_CHECKs that no reduce-scatter is in flight.
  Tensor& idle_buffer(int which, std::int64_t words);

 private:
  struct Slot {
    Tensor in, out;  // MemCategory::comm, only ever grown
    bool busy = false;
  };
  struct Pending {
    std::vector<SlicedGrad> grads;
    bool accumulate = false;
    std::size_t slot = 0;
    std::unique_ptr<CommRequest> request;
  };
  struct Bucket {
    std::vector<SlicedGrad> grads;
    int tracked = 0;  // parameters with passes > 0; all of them: may post during backward
    int waiting = 0;  // of them, still short of their last contribution this step
    bool posted = false;
  };
  struct Track {
    std::size_t bucket = 0;
    int passes = 0;  // contributions per step
    int done = 0;    // this step so far
  };

  void post(std::vector<SlicedGrad> grads, bool accumulate, bool during_backward);
  void complete_oldest();

  ProcessGroup& dp_;
  bool overlap_;
  NonFiniteGradWatch* watch_;
  std::vector<Slot> slots_ = std::vector<Slot>(kInFlight);
  std::deque<Pending> in_flight_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, Track> tracks_;
  std::size_t left_in_flight_ = 0;  // this step so far
  std::size_t posted_in_backward_ = 0;
};

}  // namespace meshtrain
