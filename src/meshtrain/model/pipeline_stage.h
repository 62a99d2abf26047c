// src/meshtrain/model/pipeline_stage.h
//
// The model chunks one pipeline rank holds (DESIGN: model/ builds one pipeline stage's layers
// for a given mesh position). The layers are cut into pp × virtual_stages chunks by
// layers_per_chunk (config/pipeline_rules.h); rank r holds global chunks r, r + pp, …
// (Megatron-LM's interleaved assignment, Narayanan et al. 2021, §2.2). Global chunk 0 carries
// the embeddings, the last one the final norm, LM head and loss. With pp = 1 and one chunk
// this is the whole model.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/mesh/placement.h"
#include "meshtrain/model/causal_lm.h"

namespace meshtrain {

class PipelineStage {
 public:
  /// Builds and initialises the chunks of pipeline rank `pp_rank` (config validated, vocab
  /// known), every layer from its parameters' records of the config's placement table
  /// (mesh/placement.h). Every chunk's parameters are initialised from (seed, name, index) as
  /// in the whole model, so the union over stages is exactly the pp = 1 model. `storage`
  /// deferred: no parameter gets values or gradients (CausalLm).
  PipelineStage(const Config& config, std::uint64_t seed, const ParallelGroups& groups, int pp_rank,
                ParameterStorage storage = ParameterStorage::allocated);

  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  CausalLm& chunk(int local) { return *chunks_[static_cast<std::size_t>(local)]; }
  /// Global chunk index of local chunk k: k·pp + pp_rank.
  int global_chunk(int local) const { return local * pp_ + pp_rank_; }
  int num_global_chunks() const { return pp_ * num_chunks(); }

  /// Every parameter of every local chunk, chunk by chunk.
  const ParameterList& parameters() const noexcept { return params_; }
  void zero_grad();
  /// Every chunk's parameter units (CausalLm::units), chunk by chunk.
  std::vector<ParameterList> units() const;
  /// Installs `hooks` in every chunk (CausalLm::set_hooks).
  void set_hooks(ParameterHooks* hooks);
  /// gpt2 split into chunks: the token embedding (global chunk 0) and/or its copy in the LM
  /// head (last chunk) held by this rank — none, one, or both when pp = 1. The gradients of the
  /// two are summed (between the first and last stage) so the copies stay identical.
  const ParameterList& tied_embeddings() const noexcept { return tied_; }
  double flops_per_token(std::int64_t seq_len) const;
  /// Every MoE layer of every local chunk (none in a dense model).
  std::vector<MoeLayerRef> moe_layers() const;
  /// Σ over every local chunk's attention layers of their core's kernel seconds so far.
  double attention_core_seconds() const noexcept;

 private:
  /// MT_CHECKs that the layers built each record of `table` this rank holds once, in the
  /// table's order (the order consumers such as checkpoints pair them in). Each parameter's
  /// slice cannot differ from its record's: the layers allocated it from the record.
  void check_built(const PlacementTable& table, const ParallelGroups& groups) const;

  int pp_, pp_rank_;
  std::vector<std::unique_ptr<CausalLm>> chunks_;
  ParameterList params_;
  ParameterList tied_;
};

}  // namespace meshtrain
