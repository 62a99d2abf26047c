// src/meshtrain/transformer/attention.h
//
// Causal self-attention with its heads split over tp (Shoeybi et al. 2019, §3, Fig. 3b): the
// q, k, v projections are column-parallel (rank r computes heads [r·H/tp, (r+1)·H/tp) and
// kv heads [r·Hkv/tp, ...)), attention runs on local heads only, and the output projection is
// row-parallel. Two naming/layout schemes:
//   GPT-2 (fused_qkv): `<prefix>.c_attn` [3C, C] holding [q; k; v] (sharded per block) and
//     `<prefix>.c_proj` [C, C]; n_kv_head == n_head; no rotary embedding.
//   Llama: `<prefix>.{q_proj [H·d, C], k_proj [Hkv·d, C], v_proj [Hkv·d, C], o_proj [C, H·d]}`,
//     grouped-query attention (Ainslie et al. 2023) and rotary position embedding (Su et al.
//     2021) on q and k.
// Under context parallelism (groups.cp) the rows are this rank's zigzag share of every
// sequence (parallel/cp/context_parallel.h): rotary angles use the rows' global positions, and
// the core runs as ring attention or Ulysses (parallel/cp/context_attention.h).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/module.h"
#include "meshtrain/parallel/cp/context_attention.h"
#include "meshtrain/parallel/tp/parallel_linear.h"
#include "meshtrain/transformer/parallel_groups.h"

namespace meshtrain {

struct AttentionShape {
  std::int64_t n_embd;     // C
  std::int64_t n_head;     // H; C % H == 0, H % tp == 0 (validated with the config)
  std::int64_t n_kv_head;  // Hkv; H % Hkv == 0, Hkv % tp == 0
  float init_std;       // q, k, v weights
  float proj_init_std;  // output projection (GPT-2 scales it by 1/√(2·n_layer))
  float rope_theta;     // > 0: rotary embedding with this base; 0: none
  bool fused_qkv;       // GPT-2's c_attn/c_proj; false: Llama's q/k/v/o_proj
};

class CausalSelfAttention final : public Module {
 public:
  /// `recompute`: RecomputeMode::selective drops the attention core's output and log-sum-exp
  /// after forward and recomputes them in backward (Korthikanti et al. 2022, §4.2's
  /// "selective activation recomputation" of the attention core); none and full keep them
  /// (under full the block discards the whole layer instead).
  /// The projections' weights (and biases, when `records` lists them) are allocated from
  /// their records (parallel_linear.h); MT_CHECKs that the heads split over tp and that the
  /// records' shapes are `shape`'s.
  CausalSelfAttention(const std::string& prefix, const AttentionShape& shape,
                      const PlacementTable& records, const ParallelGroups& groups,
                      RecomputeMode recompute = RecomputeMode::none,
                      ParameterStorage storage = ParameterStorage::allocated);

  /// x [tokens, C] (or [tokens/tp, C] under sequence parallelism; tokens = sequences ·
  /// T/cp) → same layout. Keeps, in slot ctx.slot, q, k, v (after rotation;
  /// [tokens, H/tp·d], [tokens, Hkv/tp·d] each, or the fused [tokens, 3C/tp]), the positions,
  /// and, unless selective, the attention output [tokens, H/tp·d] f32 (also the output
  /// projection's kept input) and the core's state: log-sum-exp [batch, H/tp, T/cp] f32
  /// (Ulysses: the head-sharded whole sequences, AttentionCoreState), plus what the q/k/v
  /// projection keeps.
  Tensor forward(const Tensor& x, const SequenceBatch& batch,
                 const MicroBatchContext& ctx) override;
  /// Selective: first recomputes the attention output and log-sum-exp from the kept q, k, v
  /// with the forward's kernel (the same bits). Frees the slot's state (what deferred weight
  /// gradients need stays with their queue).
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) override;
  ParameterList parameters() override;
  void discard(const MicroBatchContext& ctx) override;
  /// Seconds this layer has spent in its attention core's kernels since it was built
  /// (attention_core_forward; forwards, recomputes and backwards), for the step metrics'
  /// attention_s.
  double core_compute_seconds() const noexcept { return core_compute_s_; }

 private:
  struct State {
    SequenceBatch batch{0, 0};
    std::vector<Tensor> qkv_out;
    std::vector<std::int32_t> positions;
    Tensor att_out;           // empty between forward and backward under selective recompute
    AttentionCoreState core;  // likewise
    DType core_operands = DType::f32;  // attention_operands at forward time (recompute reuses it)
  };
  /// The attention core: s.qkv_out (q, k rotated) → fresh s.att_out and s.core.
  void attend(State& s);
  AttentionCoreShape core_shape(const State& s) const;

  AttentionShape shape_;
  std::int64_t heads_, kv_heads_, head_dim_;  // heads on this rank
  bool recompute_core_;                       // RecomputeMode::selective
  ContextParallel cp_;
  ColumnParallelLinear qkv_;
  RowParallelLinear out_;
  Saved<State> saved_;
  double core_compute_s_ = 0.0;
};

}  // namespace meshtrain
