// src/meshtrain/plan/parameters.h
//
// The parameter elements the planner's memory and traffic terms multiply: per pipeline stage,
// what one rank of it holds, and the whole model's size for the FLOPs. Every count is a sum
// over the placement table (mesh/placement.h), the records the model build checks itself
// against, so the planner counts exactly the tensors a run makes (padding included) and has no
// per-layer formula of its own. Uses: config, mesh.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/mesh/placement.h"

namespace meshtrain::plan {

/// Parameter elements of the model as one tp rank of one pipeline stage holds them (the
/// elements of its local tensors, the Ψ of docs/memory.md), and the sizes the ZeRO buffers and
/// FLOPs need. The rank is the stage's first of dp, cp and tp (ep rank 0): every rank of a
/// stage holds as many elements (tp shards are even, padding included; each ep rank E/ep
/// experts).
struct ParameterCounts {
  double total = 0.0;       // Ψ: everything the rank holds
  double tied_extra = 0.0;  // elements held in two units (gpt2's tied embedding, pp = 1): Ψ′ − Ψ
  double largest_unit = 0.0;  // Ψ_u: the largest hook unit (a block, the embeddings, the head)
  double replicated = 0.0;    // elements not split over tp (norms, positions, row biases, routers)
  std::int64_t layers = 0;    // transformer blocks on the stage
  // Mixture of experts (plan/moe.h): the expert weights among `total` (E/ep experts of each MoE
  // block, whole on every tp rank), the largest block's share of them, and the MoE blocks.
  double experts = 0.0;
  double largest_expert_unit = 0.0;
  double largest_dense_unit = 0.0;  // Ψ_u without the experts
  std::int64_t moe_layers = 0;
  bool first = false;         // holds the embeddings (global chunk 0)
  bool last = false;          // holds the final norm, LM head and loss
};

/// The whole model (tp = pp = 1): Ψ, the matrix-product parameters Ψ_mm (block linears and
/// routers + LM head) and those of the blocks alone. For a MoE model (plan/moe.h) `parameters`
/// counts every expert, `active_parameters` what one token passes through (the dense part, the
/// routers and top_k experts per MoE block), and the matmul counts are the active ones: FLOPs
/// and MFU come from them. Dense models: active = total.
struct ModelSize {
  double parameters = 0.0;
  double active_parameters = 0.0;
  double expert_parameters = 0.0;  // all experts of all MoE blocks
  double matmul_parameters = 0.0;
  double block_matmul_parameters = 0.0;
};
/// Of `model` (vocab_size > 0), from its placement table on one rank.
ModelSize model_size(const ModelConfig& model);

/// Ψ of every pipeline rank of `table`, stage by stage. The hook units are the records before
/// the first block (the embeddings), each block's, and those after the last (final norm, LM
/// head); a head without a vocabulary-parallel record (gpt2 in one chunk) uses the token
/// embedding's, which then sits in two units (tied_extra).
std::vector<ParameterCounts> stage_parameters(const PlacementTable& table);
/// Ψ of every pipeline rank under config.parallel (a validated config: placement_table(config)).
std::vector<ParameterCounts> stage_parameters(const Config& config);
/// Ψ of pipeline rank `stage`.
ParameterCounts stage_parameters(const Config& config, std::int64_t stage);

/// The counts of many layouts of one model, each computed once: a search accounts thousands of
/// layouts that share a few (tp, pp, virtual_stages, ep), the only settings beside the model
/// that change an element count (sequence parallelism, ZeRO and precision do not).
class ParameterCountCache {
 public:
  /// stage_parameters(config); every config must hold the model (block_size included) of the
  /// first call.
  const std::vector<ParameterCounts>& stages(const Config& config);
  /// model_size(model), under the same condition.
  const ModelSize& model(const ModelConfig& model);

 private:
  std::map<std::array<std::int64_t, 4>, std::vector<ParameterCounts>> stages_;
  std::optional<ModelSize> model_;
};

}  // namespace meshtrain::plan
