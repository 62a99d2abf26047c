// src/meshtrain/parallel/dp/zero.h
//
// ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models", §5) over each reduction group of N ranks (below: dp):
//   stage 0  every rank holds everything; gradients are all-reduced in buckets (GradBuckets).
//   stage 1  the fp32 master weights and Adam moments are split: rank r owns a slice of each
//            parameter and only steps that slice. Full gradients are still accumulated over the
//            micro-batches; once per step they are reduce-scattered (each rank receives the
//            dp-sum of its slices; on a ring that is half the bytes on the wire of an
//            all-reduce, which is a reduce-scatter followed by an all-gather) and, after the
//            step, the updated slices are all-gathered back into every rank's full parameters.
//   stage 2  as stage 1, but full gradients are not kept: a unit's (a transformer block's)
//            gradients live in a temporary buffer during its backward and are reduce-scattered
//            into the owner's fp32 gradient slice as soon as that backward ends, every
//            micro-batch (one reduction per micro-batch: ZeRO-2's price for not holding 4Ψ).
//   stage 3  parameters are split too (PyTorch's FSDP FULL_SHARD): a unit's parameters are
//            all-gathered just before its forward and again before its backward, and freed
//            after each; the next unit's gather is posted (non-blocking) before the current
//            unit computes. Gradients as stage 2.
// Splitting is per parameter (as FSDP2, Zhao et al. 2023): the flattened local tensor of n
// elements is cut into N slices of s = ceil(n / N) (even when the compute dtype is 16-bit, so a
// slice is whole 4-byte words on the wire); rank r owns [r·s, min((r+1)·s, n)). The last ranks'
// slices are shorter or empty: the padding exists only in communication buffers and never
// reaches the optimizer, the grad norm or a checkpoint. A collective over several parameters
// lays them out rank-major ([rank][parameter slice]) in one buffer, so one reduce-scatter or
// all-gather serves a whole unit.
// Mixed precision: the master slices are fp32; with a 16-bit compute dtype the full parameters
// every rank computes with are 16-bit copies (stage ≤ 2: kept, stage 3: gathered in 16 bits).
// Gradients are fp32 throughout and reduced in fp32.
// Reduction groups: a parameter's gradient is reduced and its optimizer state sliced over the
// ranks of its placement's replica group (mesh/placement.h, ReplicaGroup): the dense weights
// over dp × cp, the experts' over the expert-data-parallel group. As Megatron-core's
// distributed optimizer keeps dense and expert gradient buffers apart, one ZeroSharding holds
// each group's own buckets, reduce-scatters, slices and prefetches, and every call works on the
// groups in a fixed order, dense first (each collective over its own group's ranks); a model
// without experts has one group.
// Memory per rank for Ψ parameters (docs/memory.md): stage 0 16Ψ, 1 8Ψ + 8Ψ/N, 2 4Ψ + 12Ψ/N,
// 3 16Ψ/N bytes in fp32 training.
// Overlap (parallel.overlap_grad_reduce): stage 0's bucket all-reduces (GradBuckets) and the
// gradient reduce-scatters of stages 1–3 (ZeroGradReducer, zero_reduce.h) are posted during
// backward as soon as their gradients are final and waited for after it; bitwise the same
// results as without.
// Uses: comm/process_group.h, layers/ (Parameter, ParameterHooks), mesh/placement.h
// (ReplicaGroup), dp/grad_buckets.h, dp/zero_reduce.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/non_finite_grads.h"
#include "meshtrain/layers/parameter.h"
#include "meshtrain/layers/parameter_hooks.h"
#include "meshtrain/parallel/dp/grad_buckets.h"
#include "meshtrain/parallel/dp/zero_reduce.h"

namespace meshtrain {

struct ZeroOptions {
  int stage = 0;                        // 0, 1, 2 or 3 (parallel.zero_stage)
  DType compute_dtype = DType::f32;     // what the layers compute with (training.precision)
  std::int64_t bucket_bytes = 4 << 20;  // stage 0 all-reduce buckets, stage 1 reduce-scatters
  // Post each gradient reduction as soon as its gradients are final, during backward, and wait
  // after it (parallel.overlap_grad_reduce): stage 0's bucket all-reduces (GradBuckets), stage
  // 1's bucket reduce-scatters, stages 2–3's unit reduce-scatters (ZeroGradReducer).
  // `microbatches`: backward passes per step (training.accumulation); stages 0 and 1 reduce
  // a unit's gradients after its backward of the last one.
  bool overlap_grad_reduce = false;
  int microbatches = 1;
  // The model's initialisation seed: stage 3 initialises the slices of parameters built with
  // ParameterStorage::deferred itself (initialize_range), as the model would have.
  std::uint64_t seed = 0;
  // Where deferred parameters' initial values come from instead (checkpoint.init_from): fills
  // out [end − begin] with elements [begin, end) of p's flattened local tensor, as
  // initialize_range does. Empty: initialize_range from `seed`. Must not throw (it runs between
  // collectives): the caller validates its source on every rank before. Used by the
  // constructor only, not kept.
  std::function<void(const Parameter& p, std::int64_t begin, std::int64_t end, float* out)>
      initial_values;
  // Checks what this rank sends into each gradient reduction for a non-finite value
  // (training.check_for_nan_in_grad; layers/non_finite_grads.h). Null: no check.
  NonFiniteGradWatch* non_finite_watch = nullptr;
};

// zero_slice and zero_owned_range: mesh/placement.h (the table gives each rank its slice).

/// Where the parameters of one replica group are reduced and ZeRO-sliced. `mean_over`: how
/// many ranks' contributions the reduced gradient averages. A dense weight's is its group's
/// size; an expert's owner has already summed the tokens of its whole ep group (the all-to-all
/// brought them), so its gradient is the mean over dp × cp ranks, ep times its
/// expert-data-parallel group (dividing by the edp size alone is the "expert gradients × ep"
/// bug).
struct ReductionGroup {
  ProcessGroup& ranks;
  int mean_over;
};

class ZeroSharding final : public ParameterHooks {
 public:
  /// Takes over `params` (fp32, freshly initialised, gradients zero; every parameter in at
  /// least one of `units`, the model's parameter units in forward order): splits them (and
  /// each unit) by p.placement.replicas into reduction groups, the group of ReplicaGroup g
  /// running over `group_of(g)` (MT_CHECK: mean_over ≥ its size); builds this rank's optimizer
  /// shards (the fp32 master slices), converts the full parameters to the compute dtype
  /// (stage ≤ 2) or frees them (stage 3), and for stage ≥ 2 frees the full gradients.
  /// Parameters built with ParameterStorage::deferred (no value, no grad) are initialised here
  /// from options.seed (or options.initial_values): only this rank's master slices, then (stages
  /// 0–2) the full parameters from them, so no rank ever holds fp32 values it does not keep.
  /// Collective over a group when any of its parameters was deferred (the stage 1–2 all-gather
  /// of the initial slices), dense first. The same on every rank of a group (collective only in
  /// later calls). MT_CHECKs the stage.
  ZeroSharding(const ParameterList& params, const std::vector<ParameterList>& units,
               const std::function<ReductionGroup(ReplicaGroup)>& group_of,
               const ZeroOptions& options);

  /// This rank's slices, group by group (dense first: the order AdamW's moments and
  /// checkpoints follow): what AdamW steps, the grad norm sums and clipping scales.
  OptimizerShards& shards() noexcept { return shards_; }
  int stage() const noexcept { return options_.stage; }

  /// End of the step's backward passes, group by group: every shard's grad ← the mean over
  /// its group of the step's gradient for its slice, then scaled by size / mean_over (a float
  /// multiply, skipped when 1). Stage 0 all-reduces the buckets (those not posted during
  /// backward, then waits for all); stage 1 posts the reduce-scatters of the buckets backward
  /// did not post; every stage ≥ 1 then waits for its reduce-scatters in flight (stages 2–3
  /// posted theirs unit by unit in after_backward).
  void reduce_gradients();
  /// After the optimizer stepped the master slices: stage 0 with a 16-bit compute dtype copies
  /// the masters into the parameters; stages 1–2 all-gather the slices into every rank's full
  /// parameters; stage 3 does nothing (the next forward gathers).
  void publish_parameters();
  /// Zeroes the gradients for the next step (full gradients and/or gradient slices).
  /// `shards_zeroed`: AdamW::step(…, zero_grads = true) has already zeroed every shard's grad,
  /// so only what lies outside the shards is cleared: nothing at stages 0, 2 and 3, the full
  /// gradients outside this rank's slice at stage 1.
  void zero_grad(bool shards_zeroed = false);
  /// With overlap: the gradient reductions of the last step posted during backward and left
  /// in flight there, summed over the groups (stage 0: GradBuckets::posted_in_backward; stages
  /// 1–3: ZeroGradReducer::posted_in_backward); 0 without overlap.
  std::size_t buckets_posted_in_backward() const noexcept;
  /// Seconds the parameter hooks of the last step's backward spent on gradient reduction
  /// (posting, testing, waiting for a slot, and at stages 2–3 without overlap the whole
  /// reduce-scatters); what reduce_gradients() spends comes on top. Stage 3's parameter
  /// gathers are not counted.
  double reduce_seconds_in_backward() const noexcept { return backward_seconds_; }

  /// The full fp32 master of `p` (its whole local tensor, no padding), gathered over p's
  /// group. Collective over it: every rank calls it for the same parameters in the same order.
  Tensor gather_master(const Parameter& p);
  /// The full reduced gradient of `p` after reduce_gradients(), gathered over p's group.
  /// Collective over it.
  Tensor gather_grad(const Parameter& p);

  // ParameterHooks (stages 2 and 3: reduce-scatters and gathers; stages 0 and 1 with overlap:
  // posting and progressing the gradient buckets; no-ops otherwise).
  void before_forward(const ParameterList& unit, const ParameterList* next) override;
  void after_forward(const ParameterList& unit) override;
  void before_backward(const ParameterList& unit, const ParameterList* next) override;
  void after_backward(const ParameterList& unit) override;

 private:
  struct Slot {   // one parameter
    Shape shape;  // local (tp) shape
    std::int64_t numel = 0;
    std::int64_t slice = 0;  // s: elements per rank in communication buffers
    int refs = 0;            // stage 3: units holding the gathered value
    int units = 0;           // units the parameter belongs to (2: gpt2's tied embedding)
    int backward_left = 0;   // of them, still to run backward in this micro-batch
    std::size_t group = 0;   // → groups_
  };
  struct PendingGather {  // stage 3 prefetch
    const ParameterList* unit = nullptr;
    Tensor send, recv;
    std::unique_ptr<CommRequest> request;
  };
  struct Group {  // one reduction group
    ReplicaGroup kind;
    ProcessGroup& ranks;
    float rescale;          // ranks.size() / mean_over
    std::size_t begin = 0;  // its slots and shards: [begin, end) of slots_, shards_
    std::size_t end = 0;
    std::unique_ptr<GradBuckets> buckets;      // stage 0
    std::unique_ptr<ZeroGradReducer> reducer;  // stages 1–3; its slot 0 serves the all-gathers
    std::optional<PendingGather> pending;      // stage 3
  };

  /// Builds group `kind`'s slots and shards over `params` (those of the group) and, when some
  /// were deferred (stages 0–2), publishes them. Collective over the group then.
  void add_group(ReplicaGroup kind, const ParameterList& params, const ReductionGroup& where);
  /// Builds p's slot and this rank's shard in group `group` (initialising a deferred p's slice),
  /// converts or frees its full value and (stage ≥ 2) frees its full gradient.
  void add_parameter(Parameter* p, std::size_t group);
  /// Counts each parameter's units, MT_CHECKs that every unit's parameters are managed (and at
  /// stage ≥ 2 every parameter in a unit), and plans each group's overlap and stage-1 buckets.
  void plan_units(const std::vector<ParameterList>& units);
  /// The part of `unit` (a model's unit list, by address) in group i, or null when empty:
  /// cached, so a hook sees the same list object every time (the stage-3 prefetch is matched
  /// by address). Null for a null unit.
  const ParameterList* part(const ParameterList* unit, std::size_t i);

  Slot& slot(const Parameter& p);
  Group& group_for(const Parameter& p) { return groups_[slot(p).group]; }
  std::int64_t owned_begin(const Slot& s, int rank) const;
  std::int64_t owned_end(const Slot& s, int rank) const;
  std::int64_t slice_total(const ParameterList& params) const;
  /// What ZeroGradReducer needs of p: its slicing and this rank's gradient slice.
  SlicedGrad sliced(const Parameter& p);
  /// Fills `send` (compute dtype, slice_total elements) with this rank's master slices.
  void pack_masters(const ParameterList& params, Tensor& send);
  /// Copies a rank-major buffer gathered over g into the parameters' full values.
  void unpack_values(const Group& g, const ParameterList& params, const Tensor& recv);
  /// reduce_gradients() and publish_parameters() on one group (collective over it).
  void reduce_group(Group& g);
  void publish_group(Group& g);
  void post_gather(Group& g, const ParameterList& unit, PendingGather& out);
  void gather_unit(Group& g, const ParameterList& unit);
  void release_unit_values(const ParameterList& unit);
  // The hooks on group g's part of a unit (`next`: its part of the next unit, or null).
  void group_before_forward(Group& g, const ParameterList& unit, const ParameterList* next);
  void group_before_backward(Group& g, const ParameterList& unit, const ParameterList* next);
  void group_after_backward(Group& g, const ParameterList& unit);

  ZeroOptions options_;
  std::vector<Group> groups_;  // dense first
  OptimizerShards shards_;
  std::unordered_map<const Parameter*, std::size_t> index_;  // → slots_, shards_
  std::vector<Slot> slots_;
  std::map<std::pair<const ParameterList*, std::size_t>, ParameterList> parts_;  // part()
  double hook_seconds_ = 0.0;      // this step's, so far (reduce_seconds_in_backward)
  double backward_seconds_ = 0.0;  // the last finished step's
  std::vector<std::span<std::byte>> zero_spans_;  // zero_grad's list, kept between steps
};

}  // namespace meshtrain
