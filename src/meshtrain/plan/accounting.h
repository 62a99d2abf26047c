// src/meshtrain/plan/accounting.h
//
// Everything one layout costs on one cluster, as named terms: per-device memory by category
// (docs/memory.md's formulas, the ones the tracked allocator is checked against), the bytes
// each rank hands to the collectives of each axis per step (as ProcessGroup's byte counters
// count them: all-reduce and reduce-scatter their input, all-gather its input), their wire
// time on the link the placement gives the axis, the pipeline bubble, compute time from FLOPs,
// step time, tokens/s and MFU. Each term carries its formula, so `--explain` can print it.
// The parameter counts the terms multiply come from the placement table (plan/parameters.h).
// Uses: config (Config, validate), plan/formulas, plan/cluster, plan/layout, plan/parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/mesh/mesh_shape.h"
#include "meshtrain/plan/cluster.h"
#include "meshtrain/plan/layout.h"
#include "meshtrain/plan/parameters.h"

namespace meshtrain::plan {

/// One named quantity: its value in `unit` ("B", "s", "FLOP", "FLOP/s", "tokens/s", "",
/// "elements") and the formula that gave it, with the numbers substituted where short.
struct Term {
  std::string name;
  std::string formula;
  double value = 0.0;
  std::string unit;
};

/// Per-device memory of one pipeline stage, bytes, by category (core/allocator.h's).
struct MemoryBreakdown {
  std::int64_t stage = 0;
  double params = 0.0;
  double grads = 0.0;
  double optimizer = 0.0;
  double activations = 0.0;
  double comm = 0.0;
  double total() const { return params + grads + optimizer + activations + comm; }
};

/// Bytes per step one rank hands to the collectives of one axis, and their wire time.
struct AxisComm {
  Axis axis = Axis::dp;   // the mesh axis (mesh/mesh_shape.h); dp: the dp × cp gradient group
  std::int64_t size = 1;  // ranks in the group (dp: dp·cp)
  LinkKind link = LinkKind::intra_node;
  double bytes_per_step = 0.0;  // as ProcessGroup counts them
  double time_s = 0.0;          // ring formulas on the link, per step
};

/// Assumptions of the time model (docs/planner.md, "Assumptions").
struct TimeSettings {
  double efficiency = 0.0;  // achieved/peak FLOP/s of the compute; ≤ 0: the cluster's default
  double dp_overlap = 0.0;  // fraction of the dp time hidden behind compute, in [0, 1]
  // Fraction of the cp time hidden behind the attention compute, in [0, 1]. Ring attention is
  // built to overlap the next block's transfer with the current block's product; 0 charges it
  // in full, like every other axis (the assumption of docs/planner.md).
  double cp_overlap = 0.0;
  double usable_memory_fraction = 0.9;  // of memory_bytes a layout may use (runtime, fragmentation)
  // How the implementation puts tensors on the wire (docs/planner.md, "Wire formats"). The
  // defaults are meshtrain's; they change the times only, bytes_per_step stays what meshtrain's
  // ProcessGroup counts. Megatron-LM 2021 (the published runs of plan/published_runs.h) sends
  // 16-bit activations and gradients, splits each pipeline send over the tp ranks' NICs, and
  // reduces the gradients in one collective.
  double activation_wire_bytes = 4.0;  // per element of the tp collectives and the pp sends
  double gradient_wire_bytes = 4.0;    // per element of the dp gradient reduction
  // Narayanan et al. 2021, §4.1: each of the t ranks of a stage sends 1/t of the boundary
  // tensor over its own link, and the receiving stage all-gathers it inside the node.
  bool pp_scatter_gather = false;
  double dp_bucket_bytes = 0.0;  // bytes per dp collective; 0: parallel.bucket_mib; ∞: one
  // Bytes of device memory moved per attention-score element (the b·(a/t)·s² scores of each
  // layer and micro-batch) in the forward and in the backward, for an implementation that
  // materialises the scores (plan/formulas.h, attention_score_s). 0: it never does (meshtrain's
  // kernels, FlashAttention). A forward recomputed in backward (full or selective recompute)
  // moves the forward's bytes again.
  double attention_score_bytes_forward = 0.0;
  double attention_score_bytes_backward = 0.0;
};

/// The whole account of one layout.
struct Plan {
  Layout layout;
  Config config;
  std::vector<MemoryBreakdown> stages;  // one per pipeline rank
  MemoryBreakdown peak;                 // the stage with the largest total
  bool fits = false;                    // peak.total() ≤ usable fraction × memory_bytes
  std::vector<AxisComm> comm;           // dp, tp, pp, cp, ep (present only when the axis is > 1)
  double bubble = 0.0;                  // fraction of the pipeline's step that is idle
  double compute_s = 0.0;               // per step, at the assumed efficiency
  double attention_score_s = 0.0;       // per step: memory-bound s² score traffic (0 if none)
  double exposed_comm_s = 0.0;
  double step_s = 0.0;
  double tokens_per_s = 0.0;
  double mfu = 0.0;         // model FLOPs/s over devices × peak
  std::vector<Term> terms;  // every quantity above, with its formula
};

/// Accounts `layout` of `model` on `cluster` (the layout's devices need not fill the cluster;
/// the placement rule uses the cluster's devices per node). Assumes check_layout accepted it.
Plan account(const ModelConfig& model, const Layout& layout, const TrainingSettings& settings,
             const ClusterSpec& cluster, const TimeSettings& time = {});
/// The same, taking the parameter counts from `counts` (made for this model and settings), so
/// that the layouts of a search share each placement table they need.
Plan account(const ModelConfig& model, const Layout& layout, const TrainingSettings& settings,
             const ClusterSpec& cluster, const TimeSettings& time, ParameterCountCache& counts);

// --- The formulas of docs/memory.md, exposed for tests and the runtime-agreement checks ---

/// Model-state bytes of one rank holding Ψ = `params` elements, by category (params, grads,
/// optimizer), from config/validate.h's model_state_bytes_by_category.
MemoryBreakdown model_state_bytes(const Config& config, double params);

/// Activation bytes per transformer block and micro-batch on one tp rank (docs/memory.md,
/// "What each layer keeps"; bf16/fp16: linear inputs in 16 bits, the attention output 1.5×,
/// docs/mixed_precision.md "Memory").
double activation_bytes_per_block(const Config& config);

/// Peak activation bytes of pipeline stage `stage` (docs/memory.md, "The peak of a step",
/// times the micro-batches the schedule keeps in flight on that stage).
double activation_peak_bytes(const Config& config, const ParameterCounts& stage_params,
                             std::int64_t stage);

/// Peak of the ZeRO communication buffers (`MemCategory::comm`), bytes (docs/memory.md,
/// "Communication buffers").
double comm_buffer_bytes(const Config& config, const ParameterCounts& stage_params);
/// Its tp part: under sequence parallelism the tp ring's scratch block (4·b·s/t·h) and the
/// packed replicated gradients (4 B per replicated element this rank updates); 0 otherwise.
double tp_comm_buffer_bytes(const Config& config, const ParameterCounts& stage_params);
/// Its dp part: ZeRO's buckets and unit buffers (docs/memory.md).
double dp_comm_buffer_bytes(const Config& config, const ParameterCounts& stage_params);

/// dp bytes per step and rank as ProcessGroup counts them (docs/memory.md, "Communication per
/// step"), including the 8-byte loss and grad-norm reductions. With cp > 1 the group is dp × cp
/// (N = dp·cp): gradients are reduced and ZeRO shards over it.
double dp_bytes_per_step(const Config& config, const ParameterCounts& stage_params);

/// Activation tensors of b·s·h crossing the tp group per micro-batch on one stage: 2 per layer
/// forward, 2 backward, 2 more under full recompute (the block's forward runs again in backward,
/// its collectives included), + the embedding output (first stage) and the head's input
/// gradient (last stage): (4L + 2), or (6L + 2) with full recompute.
double tp_tensors_per_micro_batch(const Config& config, const ParameterCounts& stage_params);

/// tp bytes per step and rank (docs/tensor_parallel.md, "Bytes per step").
double tp_bytes_per_step(const Config& config, const ParameterCounts& stage_params);

/// pp bytes per step one rank hands to the pp group as ProcessGroup counts them: each boundary
/// activation forward and its gradient backward, counted on the sending and on the receiving
/// side, m per model chunk that has a neighbour, fp32 [b·s(/tp with sp), h]; plus 28 B of
/// scalars (step span, bubble, loss, grad norm). gpt2's tied-embedding sum is on another group.
double pp_bytes_per_step(const Config& config, const ParameterCounts& stage_params);

// --- Wire time per step of the same collectives, formulas.h's ring formulas on `link` ---

/// dp: ZeRO-0 one all-reduce of 4Ψ (in buckets of parallel.bucket_mib); ZeRO-1 a
/// reduce-scatter of 4Ψ and an all-gather of dΨ (buckets); ZeRO-2 m reduce-scatters of 4Ψ (one
/// per unit) and the all-gather; ZeRO-3 m·(reduce-scatter of 4Ψ + 2 all-gathers of dΨ′), one
/// per unit. Seconds.
double dp_time_per_step(const Config& config, const ParameterCounts& stage_params, const Link& link,
                        const TimeSettings& time = {});
/// tp: m·[(4L + 2) all-reduces of D (with sp: a reduce-scatter and an all-gather of D each) +
/// the loss's two all-reduces], D = b·s·h·4. Seconds.
double tp_time_per_step(const Config& config, const ParameterCounts& stage_params, const Link& link,
                        const TimeSettings& time = {});
/// pp: m · sends per micro-batch point-to-point messages of the boundary tensor (with
/// time.pp_scatter_gather: 1/t of it per tp rank, then an all-gather over `intra_node`).
/// Seconds. `time` sets the wire formats (TimeSettings); its defaults are meshtrain's.
double pp_time_per_step(const Config& config, const ParameterCounts& stage_params, const Link& link,
                        const TimeSettings& time = {}, const Link& intra_node = {});

}  // namespace meshtrain::plan
