// src/meshtrain/train/moe_metrics.h
//
// What users watch of a MoE model (issue 14 item 4; docs/moe.md): per MoE layer, the step's
// routing over the whole global batch — tokens per expert, the dropped fraction, the load
// imbalance and the aux and z losses. A routing collapse (every token to one expert) shows as
// imbalance → E and, with a capacity, a dropped fraction → 1 − 1/E, from the metrics alone.
// Uses: model/ (the stage's MoE layers), comm/ (the mesh). Knows nothing of the log format.
#pragma once

#include <cstdint>
#include <vector>

namespace meshtrain {

class DeviceMesh;
class PipelineStage;
struct ModelConfig;

/// One MoE layer's step, summed over every rank's training micro-batches.
struct MoeLayerMetrics {
  std::int64_t layer = 0;                       // the block's index
  std::vector<std::int64_t> routed_per_expert;  // [E] assignments the router chose
  std::vector<std::int64_t> tokens_per_expert;  // [E] assignments computed (after dropping)
  double dropped_fraction = 0.0;                // 1 − Σ computed / Σ chosen
  double imbalance = 0.0;  // max / mean of routed_per_expert: 1 balanced, E collapsed
  double aux_loss = 0.0;   // mean over micro-batches and ranks (coefficient applied)
  double z_loss = 0.0;
};

/// Takes every local MoE layer's step stats (SparseMoeBlock::take_step_stats) and sums them
/// over the ranks that saw different tokens: dp × cp, tp under sequence parallelism (without
/// it the tp ranks route the same tokens and only tp rank 0 counts), and pp (each layer lives
/// on one stage). The same result on every rank, layers in block order; empty for a dense
/// model. Collective over the dp × cp group, tp and pp (three all-reduces of
/// (2·E + 4) doubles per MoE layer).
std::vector<MoeLayerMetrics> collect_moe_metrics(PipelineStage& stage, const DeviceMesh& mesh,
                                                 const ModelConfig& model, bool sequence_parallel);

}  // namespace meshtrain
