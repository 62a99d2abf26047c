#include "meshtrain/model/pipeline_stage.h"

#include "meshtrain/config/pipeline_rules.h"
#include "meshtrain/core/error.h"
#include "meshtrain/mesh/placement.h"

namespace meshtrain {

PipelineStage::PipelineStage(const Config& config, std::uint64_t seed, const ParallelGroups& groups,
                             int pp_rank, ParameterStorage storage)
    : pp_(static_cast<int>(config.parallel.pp)), pp_rank_(pp_rank) {
  const PlacementTable table = placement_table(config);
  MT_CHECK(groups.tp.group.size() == table.mesh().tp && groups.ep.size() == table.mesh().ep,
           "groups of tp {} and ep {} for a layout of {}", groups.tp.group.size(),
           groups.ep.size(), table.mesh().to_string());
  const std::vector<std::int64_t> counts = layers_per_chunk(config);
  MT_CHECK(!counts.empty(), "invalid pipeline split (the config was not validated)");
  const int v = static_cast<int>(config.parallel.virtual_stages);
  const int last = pp_ * v - 1;
  for (int k = 0; k < v; ++k) {
    const int g = k * pp_ + pp_rank_;
    std::int64_t first_layer = 0;
    for (int c = 0; c < g; ++c) first_layer += counts[static_cast<std::size_t>(c)];
    const ChunkLayout layout{.first_layer = first_layer,
                             .num_layers = counts[static_cast<std::size_t>(g)],
                             .has_embedding = g == 0,
                             .has_head = g == last};
    chunks_.push_back(std::make_unique<CausalLm>(config.model, seed, groups, table, layout,
                                                 config.training.recompute, storage));
    for (Parameter* p : chunks_.back()->parameters()) params_.push_back(p);
  }
  check_built(table, groups);
  if (config.model.family == ModelFamily::gpt2 && last > 0) {
    // The embedding sits in global chunk 0 and its tied copy in the last; on different ranks
    // when pp > 1, in different chunks of one rank when only v > 1 (pp = 1).
    for (Parameter* p : params_) {
      if (p->name == "transformer.wte.weight") tied_.push_back(p);
    }
  }
}

void PipelineStage::check_built(const PlacementTable& table, const ParallelGroups& groups) const {
  // This rank as the table sees it: its pp, tp and ep coordinates (ep rank = d mod ep); dp and
  // cp ranks hold the same tensors.
  const MeshCoords c{.pp = pp_rank_, .dp = groups.ep.rank(), .cp = 0, .tp = groups.tp.group.rank()};
  const std::vector<const ParamPlacement*> held = table.held_by(c);
  MT_CHECK(held.size() == params_.size(), "stage {} built {} parameters, its placements list {}",
           pp_rank_, params_.size(), held.size());
  for (std::size_t i = 0; i < held.size(); ++i) {
    const ParamPlacement& built = params_[i]->placement;
    MT_CHECK(built.name == held[i]->name && built.tied_copy == held[i]->tied_copy,
             "stage {}: parameter {} is {}{} in the placement table's order", pp_rank_, i,
             held[i]->name, held[i]->tied_copy ? " (tied copy)" : "");
  }
}

void PipelineStage::zero_grad() {
  for (const auto& c : chunks_) c->zero_grad();
}

std::vector<ParameterList> PipelineStage::units() const {
  std::vector<ParameterList> out;
  for (const auto& c : chunks_) out.insert(out.end(), c->units().begin(), c->units().end());
  return out;
}

void PipelineStage::set_hooks(ParameterHooks* hooks) {
  for (const auto& c : chunks_) c->set_hooks(hooks);
}

double PipelineStage::flops_per_token(std::int64_t seq_len) const {
  return chunks_.front()->flops_per_token(seq_len);
}

std::vector<MoeLayerRef> PipelineStage::moe_layers() const {
  std::vector<MoeLayerRef> out;
  for (const auto& chunk : chunks_) {
    for (const MoeLayerRef& m : chunk->moe_layers()) out.push_back(m);
  }
  return out;
}

double PipelineStage::attention_core_seconds() const noexcept {
  double sum = 0.0;
  for (const auto& chunk : chunks_) sum += chunk->attention_core_seconds();
  return sum;
}

}  // namespace meshtrain
