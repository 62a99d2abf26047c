#include "meshtrain/train/moe_metrics.h"

#include <algorithm>
#include <span>

#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/config/config.h"
#include "meshtrain/layers/placement.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/train/optimizer_state.h"

namespace meshtrain {

std::vector<MoeLayerMetrics> collect_moe_metrics(PipelineStage& stage, const DeviceMesh& mesh,
                                                 const ModelConfig& model, bool sequence_parallel) {
  if (model.moe_experts < 1) return {};
  const std::int64_t E = model.moe_experts, freq = model.moe_layer_freq;
  const std::int64_t layers = (model.n_layer + freq - 1) / freq;  // blocks 0, freq, 2·freq, …
  // Per MoE layer: routed [E], computed [E], micro-batches, tokens, aux, z.
  const std::int64_t width = 2 * E + 4;
  std::vector<double> table(static_cast<std::size_t>(layers * width), 0.0);
  ProcessGroup& tp = mesh.group(Axis::tp);
  const bool counts = sequence_parallel || tp.rank() == 0;
  for (const MoeLayerRef& ref : stage.moe_layers()) {
    const MoeStepStats s = ref.block->take_step_stats();
    if (!counts) continue;
    double* row = table.data() + ref.layer / freq * width;
    for (std::int64_t e = 0; e < E; ++e) {
      row[e] = static_cast<double>(s.routed_per_expert[static_cast<std::size_t>(e)]);
      row[E + e] = static_cast<double>(s.tokens_per_expert[static_cast<std::size_t>(e)]);
    }
    row[2 * E] = static_cast<double>(s.micro_batches);
    row[2 * E + 1] = static_cast<double>(s.tokens);
    row[2 * E + 2] = s.aux_loss;
    row[2 * E + 3] = s.z_loss;
  }
  grad_reduction_group(mesh).all_reduce_sum(std::span<double>(table));
  tp.all_reduce_sum(std::span<double>(table));
  mesh.group(Axis::pp).all_reduce_sum(std::span<double>(table));

  std::vector<MoeLayerMetrics> out;
  for (std::int64_t l = 0; l < layers; ++l) {
    const double* row = table.data() + l * width;
    MoeLayerMetrics m;
    m.layer = l * freq;
    double routed = 0.0, computed = 0.0, most = 0.0;
    for (std::int64_t e = 0; e < E; ++e) {
      m.routed_per_expert.push_back(static_cast<std::int64_t>(row[e]));
      m.tokens_per_expert.push_back(static_cast<std::int64_t>(row[E + e]));
      routed += row[e];
      computed += row[E + e];
      most = std::max(most, row[e]);
    }
    const double micro_batches = row[2 * E];
    m.dropped_fraction = routed > 0.0 ? 1.0 - computed / routed : 0.0;
    m.imbalance = routed > 0.0 ? most / (routed / static_cast<double>(E)) : 0.0;
    m.aux_loss = micro_batches > 0.0 ? row[2 * E + 2] / micro_batches : 0.0;
    m.z_loss = micro_batches > 0.0 ? row[2 * E + 3] / micro_batches : 0.0;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace meshtrain
