#include "meshtrain/plan/parameters.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <string_view>

#include "meshtrain/config/validate.h"

namespace meshtrain::plan {
namespace {

double f(std::int64_t v) { return static_cast<double>(v); }

// The block a record belongs to ("model.layers.3.…", "transformer.h.3.…"); nullopt for the
// embeddings, the final norm and the LM head.
std::optional<std::int64_t> block_of(std::string_view name) {
  for (const std::string_view prefix : {"model.layers.", "transformer.h."}) {
    if (!name.starts_with(prefix)) continue;
    std::int64_t block = 0;
    const char* begin = name.data() + prefix.size();
    const auto [ptr, ec] = std::from_chars(begin, name.data() + name.size(), block);
    if (ec == std::errc() && ptr != begin) return block;
  }
  return std::nullopt;
}

// One hook unit's elements on a rank.
struct Unit {
  std::int64_t elements = 0;
  std::int64_t experts = 0;   // of them in expert weights
  std::int64_t matrices = 0;  // of them in 2-D weights that are not experts (linears, router)
  std::int64_t vocab = 0;     // of them in a vocabulary-parallel table (embedding, LM head)
};

// What the first rank of one pipeline stage holds, unit by unit.
struct StageUnits {
  std::map<std::int64_t, Unit> blocks;
  Unit embeddings, head;
  std::int64_t replicated = 0;  // not split over tp, not an expert
  std::int64_t tied = 0;  // elements the head shares with the embeddings (gpt2 in one chunk)
  bool first = false, last = false;
};

std::vector<StageUnits> units_by_stage(const PlacementTable& table) {
  const MeshShape& mesh = table.mesh();
  std::vector<StageUnits> out(static_cast<std::size_t>(mesh.pp));
  const int last_chunk = table.params().empty() ? 0 : table.params().back().chunk;
  bool blocks_begun = false;  // the records come in model order, chunk by chunk
  for (const ParamPlacement& p : table.params()) {
    const std::optional<std::int64_t> block = block_of(p.name);
    blocks_begun = blocks_begun || block.has_value();
    const MeshCoords c{.pp = p.on(Axis::pp).owner};
    if (!p.held_by(mesh, c)) continue;  // another ep rank's expert
    StageUnits& s = out[static_cast<std::size_t>(c.pp)];
    s.first = s.first || p.chunk == 0;
    s.last = s.last || p.chunk == last_chunk;
    Unit& u = block ? s.blocks[*block] : blocks_begun ? s.head : s.embeddings;
    const std::int64_t n = shape_numel(p.local_shape(mesh, c));
    u.elements += n;
    if (p.on(Axis::ep).kind == PlacementKind::owned) {
      u.experts += n;
      continue;
    }
    if (!p.sharded_over_tp()) s.replicated += n;
    if (p.sharded_over_tp() && !block) u.vocab += n;
    if (p.shape.size() == 2 && block) u.matrices += n;
  }
  // gpt2's LM head is its token embedding: in one chunk the table has no copy of it.
  for (StageUnits& s : out) {
    if (s.last && s.head.vocab == 0) {
      s.tied = s.head.vocab = s.embeddings.vocab;
      s.head.elements += s.tied;
    }
  }
  return out;
}

ParameterCounts counts_of(const StageUnits& s) {
  ParameterCounts c;
  c.first = s.first;
  c.last = s.last;
  c.replicated = f(s.replicated);
  c.layers = static_cast<std::int64_t>(s.blocks.size());
  std::int64_t total = 0, experts = 0, largest = 0, largest_dense = 0, largest_experts = 0;
  const auto unit = [&](const Unit& u) {
    largest = std::max(largest, u.elements);
    largest_dense = std::max(largest_dense, u.elements - u.experts);
  };
  for (const auto& [index, b] : s.blocks) {
    unit(b);
    total += b.elements;
    experts += b.experts;
    largest_experts = std::max(largest_experts, b.experts);
    c.moe_layers += b.experts > 0 ? 1 : 0;
  }
  if (s.first) {
    unit(s.embeddings);
    total += s.embeddings.elements;
  }
  if (s.last) {
    unit(s.head);
    total += s.head.elements - s.tied;  // a shared tensor counts once
  }
  c.total = f(total);
  c.tied_extra = f(s.tied);
  c.experts = f(experts);
  c.largest_unit = f(largest);
  c.largest_dense_unit = f(largest_dense);
  c.largest_expert_unit = f(largest_experts);
  return c;
}

}  // namespace

std::vector<ParameterCounts> stage_parameters(const PlacementTable& table) {
  std::vector<ParameterCounts> out;
  for (const StageUnits& s : units_by_stage(table)) out.push_back(counts_of(s));
  return out;
}

std::vector<ParameterCounts> stage_parameters(const Config& config) {
  return stage_parameters(placement_table(config));
}

ParameterCounts stage_parameters(const Config& config, std::int64_t stage) {
  return stage_parameters(config).at(static_cast<std::size_t>(stage));
}

ModelSize model_size(const ModelConfig& model) {
  // A claim check sizes the model before any rule has checked it: one without a placement
  // table (no heads, no vocabulary, a negative size) has no size; moe_layer_freq < 1 reads as
  // 1, as plan/moe.h's is_moe_layer does.
  if (model.n_head < 1 || model.n_embd < 1 || model.vocab_size < 1 || model.block_size < 1 ||
      model.n_layer < 0 || ffn_hidden_of(model) < 0 || kv_heads_of(model) < 1 ||
      model.moe_experts < 0 || moe_ffn_hidden_of(model) < 0) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    return {nan, nan, nan, nan, nan};
  }
  ModelConfig m = model;
  m.moe_layer_freq = std::max<std::int64_t>(m.moe_layer_freq, 1);
  PlacementLayout one_rank;
  one_rank.layers_per_chunk = {m.n_layer};
  const StageUnits all = units_by_stage(placement_table(m, one_rank)).front();
  const ParameterCounts counts = counts_of(all);
  // A token passes through top_k of the E experts of a MoE block: k/E of its expert elements
  // (whole numbers: a block holds E equal experts).
  const std::int64_t E = std::max<std::int64_t>(m.moe_experts, 1), k = m.moe_top_k;
  std::int64_t idle = 0, block_matmul = 0;
  for (const auto& [index, b] : all.blocks) {
    idle += b.experts / E * std::max<std::int64_t>(m.moe_experts - k, 0);
    block_matmul += b.matrices + b.experts / E * k;
  }
  ModelSize s;
  s.parameters = counts.total;
  s.expert_parameters = counts.experts;
  s.active_parameters = f(static_cast<std::int64_t>(counts.total) - idle);
  s.block_matmul_parameters = f(block_matmul);
  s.matmul_parameters = f(block_matmul + all.head.vocab);  // + the LM head (tied or not)
  return s;
}

const std::vector<ParameterCounts>& ParameterCountCache::stages(const Config& config) {
  const ParallelConfig& p = config.parallel;
  const std::array<std::int64_t, 4> key{p.tp, p.pp, p.virtual_stages, p.ep};
  auto it = stages_.find(key);
  if (it == stages_.end()) it = stages_.emplace(key, stage_parameters(config)).first;
  return it->second;
}

const ModelSize& ParameterCountCache::model(const ModelConfig& model) {
  if (!model_) model_ = model_size(model);
  return *model_;
}

}  // namespace meshtrain::plan
