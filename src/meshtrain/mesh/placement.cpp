#include "meshtrain/mesh/placement.h"

#include <fmt/format.h>

#include <algorithm>

#include "meshtrain/config/pipeline_rules.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

std::string_view to_string(ReplicaGroup group) {
  return group == ReplicaGroup::expert ? "expert" : "dense";
}

PlacementRanks placement_ranks(const MeshShape& shape, int rank) {
  const MeshCoords c = shape.coords_of(rank);
  return {.tp = c.tp, .dense = c.dp * shape.cp + c.cp, .expert = c.dp / shape.ep * shape.cp + c.cp};
}

int replica_count(const MeshShape& shape, ReplicaGroup g) {
  return g == ReplicaGroup::expert ? shape.dp * shape.cp / shape.ep : shape.dp * shape.cp;
}

std::int64_t zero_slice(int stage, std::int64_t numel, int ranks, bool low_precision) {
  if (stage == 0) return numel;
  std::int64_t slice = (numel + ranks - 1) / ranks;
  if (low_precision && slice % 2 != 0) ++slice;  // whole 4-byte words per rank on the wire
  return slice;
}

std::pair<std::int64_t, std::int64_t> zero_owned_range(int stage, std::int64_t numel, int rank,
                                                       int ranks, bool low_precision) {
  if (stage == 0) return {0, numel};
  const std::int64_t slice = zero_slice(stage, numel, ranks, low_precision);
  return {std::min(rank * slice, numel), std::min((rank + 1) * slice, numel)};
}

ParamPlacement ParamPlacement::whole(std::string name, Shape shape) {
  return {.name = std::move(name), .shape = std::move(shape)};
}

ParamPlacement ParamPlacement::tp_shard(std::string name, Shape shape, int dim,
                                        std::int64_t parts) {
  ParamPlacement p = whole(std::move(name), std::move(shape));
  p.axes[static_cast<std::size_t>(Axis::tp)] = {
      .kind = PlacementKind::shard, .dim = dim, .parts = parts};
  return p;
}

bool ParamPlacement::held_by(const MeshShape& mesh, const MeshCoords& c) const {
  const AxisPlacement& pp = on(Axis::pp);
  const AxisPlacement& ep = on(Axis::ep);
  if (pp.kind == PlacementKind::owned && pp.owner != c.pp) return false;
  return ep.kind != PlacementKind::owned || ep.owner == c.dp % mesh.ep;  // ep rank = d mod ep
}

ShardSlice ParamPlacement::tp_slice(int rank, int ranks) const {
  const AxisPlacement& tp = on(Axis::tp);
  if (tp.kind != PlacementKind::shard) return meshtrain::whole(shape);
  return even_shard(shape, tp.dim, rank, ranks, tp.parts);
}

Shape ParamPlacement::local_shape(const MeshShape& mesh, const MeshCoords& c) const {
  const ShardSlice s = slice(mesh, c);
  Shape local = s.logical_shape;
  if (!local.empty()) local[static_cast<std::size_t>(s.dim)] = s.parts * s.stride;
  return local;
}

std::pair<std::int64_t, std::int64_t> ParamPlacement::zero_range(const MeshShape& mesh,
                                                                 const MeshCoords& c) const {
  const PlacementRanks ranks = placement_ranks(mesh, mesh.rank_of(c));
  return zero_owned_range(zero_stage, shape_numel(local_shape(mesh, c)), ranks.replica(replicas),
                          replica_count(mesh, replicas), low_precision);
}

bool ParamPlacement::counts_copy(const PlacementRanks& ranks) const {
  if (tied_copy) return false;
  if (!sharded_over_tp() && ranks.tp != 0) return false;
  return zero_stage >= 1 || ranks.replica(replicas) == 0;
}

std::vector<Axis> ParamPlacement::grad_sum_axes(const MeshShape& mesh) const {
  std::vector<Axis> out;
  if (tied && mesh.pp > 1) out.push_back(Axis::pp);
  const int dp = replicas == ReplicaGroup::expert ? mesh.dp / mesh.ep : mesh.dp;
  if (dp > 1) out.push_back(Axis::dp);
  if (mesh.cp > 1) out.push_back(Axis::cp);
  if (sum_over_tp) out.push_back(Axis::tp);
  return out;
}

PlacementLayout placement_layout(const Config& config) {
  const ParallelConfig& p = config.parallel;
  return {.mesh = {.pp = static_cast<int>(p.pp),
                   .dp = static_cast<int>(p.dp),
                   .cp = static_cast<int>(p.cp),
                   .tp = static_cast<int>(p.tp),
                   .ep = static_cast<int>(p.ep)},
          .sequence_parallel = p.sequence_parallel,
          .zero_stage = static_cast<int>(p.zero_stage),
          .low_precision = config.training.precision != Precision::fp32,
          .layers_per_chunk = layers_per_chunk(config)};
}

PlacementTable::PlacementTable(MeshShape mesh, std::vector<ParamPlacement> params)
    : mesh_(mesh), params_(std::move(params)) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    index_.emplace(std::pair(params_[i].name, params_[i].tied_copy), i);
  }
}

const ParamPlacement& PlacementTable::at(std::string_view name, bool tied_copy) const {
  const ParamPlacement* p = lookup(name, tied_copy);
  MT_CHECK(p != nullptr, "no parameter {}{} in the placement table", name,
           tied_copy ? " (tied copy)" : "");
  return *p;
}

const ParamPlacement* PlacementTable::find(std::string_view name) const {
  return lookup(name, false);
}

const ParamPlacement* PlacementTable::lookup(std::string_view name, bool tied_copy) const {
  const auto it = index_.find(std::pair(std::string(name), tied_copy));
  return it == index_.end() ? nullptr : &params_[it->second];
}

std::vector<const ParamPlacement*> PlacementTable::held_by(const MeshCoords& c) const {
  std::vector<const ParamPlacement*> out;
  const int chunks = params_.empty() ? 0 : params_.back().chunk + 1;
  for (int g = c.pp; g < chunks; g += mesh_.pp) {
    for (const ParamPlacement& p : params_) {
      if (p.chunk == g && p.held_by(mesh_, c)) out.push_back(&p);
    }
  }
  return out;
}

std::string to_string(const AxisPlacement& a) {
  switch (a.kind) {
    case PlacementKind::shard:
      return a.parts == 1 ? fmt::format("shard({})", a.dim)
                          : fmt::format("shard({}, {} parts)", a.dim, a.parts);
    case PlacementKind::owned:
      return fmt::format("owned({})", a.owner);
    case PlacementKind::replicate:
      break;
  }
  return "replicate";
}

namespace {

// Builds the records in the order model/causal_lm.cpp makes the parameters.
class TableBuilder {
 public:
  TableBuilder(const ModelConfig& m, const PlacementLayout& l) : m_(m), l_(l) {}

  std::vector<ParamPlacement> build() {
    const auto& counts = l_.layers_per_chunk;
    MT_CHECK(!counts.empty() && static_cast<int>(counts.size()) % l_.mesh.pp == 0,
             "{} model chunks for pp = {} (the config was not validated)", counts.size(),
             l_.mesh.pp);
    MT_CHECK(m_.vocab_size > 0, "vocab_size must be known before placing the model");
    const int last = static_cast<int>(counts.size()) - 1;
    const bool llama = m_.family == ModelFamily::llama;
    const bool tied = !llama && last > 0;  // gpt2's embedding and head in different chunks
    std::int64_t layer = 0;
    for (int g = 0; g <= last; ++g) {
      chunk_ = g;
      if (g == 0) {
        add_vocab(llama ? "model.embed_tokens.weight" : "transformer.wte.weight", tied, false);
        if (!llama) add("transformer.wpe.weight", {m_.block_size, m_.n_embd});
      }
      for (std::int64_t n = 0; n < counts[static_cast<std::size_t>(g)]; ++n) block(layer++);
      if (g == last) {
        norm(llama ? "model.norm" : "transformer.ln_f");
        if (llama) add_vocab("lm_head.weight", false, false);
        if (tied) add_vocab("transformer.wte.weight", true, true);
      }
    }
    return std::move(out_);
  }

 private:
  ParamPlacement& add(std::string name, Shape shape) {
    ParamPlacement p{.name = std::move(name), .shape = std::move(shape), .chunk = chunk_};
    p.axes[static_cast<std::size_t>(Axis::pp)] = {.kind = PlacementKind::owned,
                                                  .owner = chunk_ % l_.mesh.pp};
    p.zero_stage = l_.zero_stage;
    p.low_precision = l_.low_precision;
    p.sum_over_tp = l_.sequence_parallel && l_.mesh.tp > 1;  // cleared by shard_tp
    out_.push_back(std::move(p));
    return out_.back();
  }
  void shard_tp(ParamPlacement& p, int dim, std::int64_t parts = 1) {
    p.axes[static_cast<std::size_t>(Axis::tp)] = {
        .kind = PlacementKind::shard, .dim = dim, .parts = parts};
    p.sum_over_tp = false;
  }
  void add_vocab(std::string name, bool tied, bool copy) {
    ParamPlacement& p = add(std::move(name), {m_.vocab_size, m_.n_embd});
    shard_tp(p, 0);
    p.tied = tied;
    p.tied_copy = copy;
  }
  void norm(const std::string& prefix) {
    add(prefix + ".weight", {m_.n_embd});
    if (m_.family == ModelFamily::gpt2 && m_.bias) add(prefix + ".bias", {m_.n_embd});
  }
  // ColumnParallelLinear: weight [out, in] and bias [out] split along out.
  void column(const std::string& prefix, std::int64_t out, std::int64_t in,
              std::int64_t parts = 1) {
    shard_tp(add(prefix + ".weight", {out, in}), 0, parts);
    if (m_.bias) shard_tp(add(prefix + ".bias", {out}), 0, parts);
  }
  // RowParallelLinear: weight [out, in] split along in; the bias is added after the sum.
  void row(const std::string& prefix, std::int64_t out, std::int64_t in) {
    shard_tp(add(prefix + ".weight", {out, in}), 1);
    if (m_.bias) add(prefix + ".bias", {out});
  }
  void block(std::int64_t i) {
    const std::int64_t C = m_.n_embd, hd = C / m_.n_head, F = ffn_hidden_of(m_);
    if (m_.family == ModelFamily::gpt2) {
      const std::string p = fmt::format("transformer.h.{}", i);
      norm(p + ".ln_1");
      column(p + ".attn.c_attn", 3 * C, C, 3);
      row(p + ".attn.c_proj", C, C);
      norm(p + ".ln_2");
      column(p + ".mlp.c_fc", F, C);
      row(p + ".mlp.c_proj", C, F);
      return;
    }
    const std::string p = fmt::format("model.layers.{}", i);
    norm(p + ".input_layernorm");
    column(p + ".self_attn.q_proj", m_.n_head * hd, C);
    column(p + ".self_attn.k_proj", kv_heads_of(m_) * hd, C);
    column(p + ".self_attn.v_proj", kv_heads_of(m_) * hd, C);
    row(p + ".self_attn.o_proj", C, m_.n_head * hd);
    norm(p + ".post_attention_layernorm");
    if (m_.moe_experts >= 1 && i % m_.moe_layer_freq == 0) {
      moe(p);
    } else {
      column(p + ".mlp.gate_proj", F, C);
      column(p + ".mlp.up_proj", F, C);
      row(p + ".mlp.down_proj", C, F);
    }
  }
  // Mixtral's sparse block: the router replicated, expert j on ep rank j div (E/ep), reduced
  // over its expert-data-parallel group.
  void moe(const std::string& p) {
    const std::int64_t E = m_.moe_experts, C = m_.n_embd, F = moe_ffn_hidden_of(m_);
    add(p + ".block_sparse_moe.gate.weight", {E, C});
    const std::int64_t per_rank = E / l_.mesh.ep;
    for (std::int64_t j = 0; j < E; ++j) {
      const std::string e = fmt::format("{}.block_sparse_moe.experts.{}", p, j);
      for (auto [w, shape] : {std::pair{".w1.weight", Shape{F, C}}, std::pair{".w3.weight", Shape{F, C}},
                              std::pair{".w2.weight", Shape{C, F}}}) {
        ParamPlacement& x = add(e + w, shape);
        x.axes[static_cast<std::size_t>(Axis::ep)] = {
            .kind = PlacementKind::owned, .owner = static_cast<int>(j / per_rank)};
        // With ep = 1 every dp × cp rank holds every expert: its replicas are the dense ones.
        x.replicas = l_.mesh.ep > 1 ? ReplicaGroup::expert : ReplicaGroup::dense;
      }
    }
  }

  const ModelConfig& m_;
  const PlacementLayout& l_;
  int chunk_ = 0;
  std::vector<ParamPlacement> out_;
};

}  // namespace

PlacementTable placement_table(const ModelConfig& model, const PlacementLayout& layout) {
  MT_CHECK(layout.mesh.ep >= 1 && model.moe_experts % layout.mesh.ep == 0,
           "{} experts over ep = {} (the config was not validated)", model.moe_experts,
           layout.mesh.ep);
  return PlacementTable(layout.mesh, TableBuilder(model, layout).build());
}

PlacementTable placement_table(const Config& config) {
  return placement_table(config.model, placement_layout(config));
}

}  // namespace meshtrain
