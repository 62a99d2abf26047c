// src/meshtrain/transformer/moe.h — the sparse mixture-of-experts feed-forward block of Mixtral
// (Jiang et al. 2024, §2.1; Hugging Face MixtralSparseMoeBlock), with the expert capacity and
// token dropping of Switch Transformer (Fedus et al. 2021, §2.2) as Megatron-LM offers it, the
// Switch load-balancing loss and the ST-MoE router z-loss (Zoph et al. 2022, eq. 5). The math,
// the capacity rule and what is reported: docs/moe.md.
//
// Parameters (Hugging Face Mixtral names and layouts, one Parameter per expert weight so that
// expert parallel can place experts on ep ranks by name):
//   <prefix>.block_sparse_moe.gate.weight        [E, C]  router, no bias
//   <prefix>.block_sparse_moe.experts.{j}.w1.weight  [F, C]  gate projection
//   <prefix>.block_sparse_moe.experts.{j}.w3.weight  [F, C]  up projection
//   <prefix>.block_sparse_moe.experts.{j}.w2.weight  [C, F]  down projection
//
// Forward of x [N, C] f32 (N = the micro-batch's tokens as this layer sees them):
//   1. route:    logits = x·Wgᵀ (f32: a 16-bit router weight is widened), probs = softmax,
//                top-k experts, weights renormalised to sum 1 per token;
//   2. dispatch: plan_moe_dispatch (moe_routing.h) — per-expert counts, capacity dropping,
//                the packed row order (by expert, token order within an expert); gather x's
//                rows into packed [rows, C];
//   3. experts:  GroupedSwiGluExperts on contiguous row blocks, one GEMM per weight and expert;
//   4. combine:  y[n] = Σ_j w_j·expert_j(x[n]) over the token's kept assignments (a dropped one
//                contributes 0: the token still passes through the block's residual).
// Expert parallel (ep > 1) inserts its all-to-all between 2 and 3 (exchange counts, then rows)
// and between 3 and 4 (rows back): parallel/ep/expert_parallel.h. Ep rank e then holds experts
// [e·E/ep, (e+1)·E/ep) (their placements, mesh/placement.h: owned over ep, reduced over the
// expert-data-parallel group), the router is replicated, and each rank routes, drops and
// combines its own tokens (capacity from its own N, the same on every rank of a layout).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/module.h"
#include "meshtrain/parallel/ep/expert_parallel.h"
#include "meshtrain/transformer/moe_routing.h"
#include "meshtrain/transformer/parallel_groups.h"

namespace meshtrain {

struct MoeShape {
  std::int64_t n_embd;          // C
  std::int64_t moe_experts;     // E ≥ 1
  std::int64_t moe_top_k;       // k, 1 ≤ k ≤ E
  std::int64_t moe_ffn_hidden;  // F, each expert's SwiGLU width
  float init_std;               // router, w1 and w3
  float proj_init_std;          // w2
};

/// Megatron-LM's moe_* settings of the same names.
struct MoeOptions {
  /// 0 = dropless; else each expert keeps at most moe_expert_capacity(N, k, E, factor)
  /// assignments of the N tokens of a forward (moe_routing.h).
  double moe_capacity_factor = 0.0;
  MoeDropPolicy moe_token_drop_policy = MoeDropPolicy::probs;
  double moe_aux_loss_coeff = 0.0;  // Switch load-balancing loss coefficient
  double moe_z_loss_coeff = 0.0;    // ST-MoE router z-loss coefficient
};

/// What the last forward (any activation slot) routed, for logging and metrics.
struct MoeStats {
  std::int64_t tokens = 0;
  std::optional<std::int64_t> capacity;         // nullopt: dropless
  std::vector<std::int64_t> routed_per_expert;  // [E] assignments chosen, before dropping
  std::vector<std::int64_t> tokens_per_expert;  // [E] assignments computed, after dropping
  std::int64_t dropped = 0;                     // assignments dropped
  double dropped_fraction = 0.0;                // dropped / (N·k); 0 when N = 0
  MoeRouterLosses losses;                       // load balance, aux, z (values)
};

/// The experts of one MoE layer run as a grouped pass: rows [offsets[e], offsets[e+1]) of a
/// packed buffer go through expert e's SwiGLU, silu(x·w1ᵀ)·(x·w3ᵀ)·w2ᵀ (Shazeer 2020). Each
/// weight is read by the autocast rule (layers/autocast.h): a 16-bit expert multiplies its rows
/// rounded to its dtype with f32 accumulation. The experts of a rank are those its records
/// place on its ep coordinate: one rank, all E; ep rank e of ep, experts.{e·E/ep + i} for
/// i < E/ep (the block the all-to-all of expert_parallel.h assumes).
class GroupedSwiGluExperts {
 public:
  /// Experts `<prefix>.{j}` (j < experts) whose records in `records` are held by ep rank
  /// `ep_rank` of `ep_size` (owned by it along ep, or not owned along ep at all), each
  /// allocated from its records: w1 and w3 [F, C] N(0, init_std²), w2 [C, F]
  /// N(0, proj_init_std²). MT_CHECKs that they are the rank's block of E/ep_size experts.
  GroupedSwiGluExperts(const std::string& prefix, std::int64_t experts,
                       const PlacementTable& records, int ep_rank, int ep_size, float init_std,
                       float proj_init_std, ParameterStorage storage = ParameterStorage::allocated);

  /// packed [rows, C] f32, counts [count] rows per expert (Σ = rows) → [rows, C] f32. Keeps
  /// the rows as each expert's matmul reads them, gate and up [rows, F] f32 and the activation
  /// in slot ctx.slot.
  Tensor forward(const Tensor& packed, std::span<const std::int64_t> counts,
                 const MicroBatchContext& ctx);
  /// d_out [rows, C] → d_packed [rows, C] (overwritten); accumulates every expert's weight
  /// gradients (deferred to ctx's weight-gradient queue when it names one); frees the slot's
  /// state.
  Tensor backward(const Tensor& d_out, const MicroBatchContext& ctx);
  void discard(const MicroBatchContext& ctx) { saved_.release(ctx.slot); }
  ParameterList parameters();

 private:
  struct Expert {
    Parameter w1, w3, w2;
  };
  std::int64_t n_embd_, hidden_;
  std::vector<Expert> experts_;
  struct State {
    std::vector<std::int64_t> offsets;  // [count + 1]
    std::vector<Tensor> x_in;           // per expert: its rows as w1/w3 read them
    std::vector<Tensor> act_in;         // per expert: silu(gate)·up as w2 reads it
    Tensor gate, up;                    // [rows, F] f32
  };
  Saved<State> saved_;
};

/// What the backward passes since the last take_step_stats() routed — the step's training
/// micro-batches, each once (a recomputed forward is not counted twice; evaluation, which has
/// no backward, not at all).
struct MoeStepStats {
  std::int64_t micro_batches = 0;
  std::int64_t tokens = 0;                      // Σ N
  std::vector<std::int64_t> routed_per_expert;  // [E] Σ assignments chosen, before dropping
  std::vector<std::int64_t> tokens_per_expert;  // [E] Σ assignments computed, after dropping
  std::int64_t dropped = 0;                     // Σ assignments dropped
  double aux_loss = 0.0, z_loss = 0.0;          // Σ over micro-batches (coefficients applied)
};

class SparseMoeBlock final : public Module {
 public:
  /// `prefix` is the decoder layer's, e.g. "model.layers.3". MT_CHECKs the shape (E ≥ 1,
  /// 1 ≤ k ≤ E, C, F ≥ 1, E % ep == 0) and options (capacity factor and coefficients ≥ 0); the
  /// config reports them first as ConfigErrors. This rank builds experts of its ep rank only.
  /// `tokens`: the ranks sharing this layer's micro-batches (its aux and z losses are theirs).
  /// The router and this rank's experts are allocated from their records in `records`
  /// (GroupedSwiGluExperts), after the checks.
  SparseMoeBlock(const std::string& prefix, const MoeShape& shape, const MoeOptions& options,
                 const PlacementTable& records, ExpertParallel ep = {}, MoeTokenGroup tokens = {},
                 ParameterStorage storage = ParameterStorage::allocated);

  /// x [N, C] f32 → y [N, C] f32. Keeps x, the router's probs [N, E], lse [N], top-k experts
  /// and weights [N, k], the dispatch plan and the experts' packed outputs [rows, C] in the
  /// slot ctx.slot (plus the experts' own state); updates stats().
  Tensor forward(const Tensor& x, const SequenceBatch& batch,
                 const MicroBatchContext& ctx) override;
  /// dy [N, C] → dx [N, C]. Accumulates the router's and experts' gradients, including those
  /// of the aux and z losses (scaled by loss_grad_scale()), exactly; frees the slot's state.
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) override;
  /// Router, then this rank's experts in index order as w1, w3, w2 each.
  ParameterList parameters() override;
  void discard(const MicroBatchContext& ctx) override;

  /// The aux and z losses are added to the model's loss: their gradients enter backward
  /// multiplied by this factor, which the trainer sets to what multiplies the main loss's
  /// gradient (loss scale / micro-batches; Megatron-LM's MoEAuxLossAutoScaler). Default 1.
  void set_loss_grad_scale(double scale) { loss_grad_scale_ = scale; }
  double loss_grad_scale() const { return loss_grad_scale_; }
  const MoeStats& stats() const { return stats_; }
  /// The step's totals so far (see MoeStepStats), and a fresh start for the next step.
  MoeStepStats take_step_stats();
  const MoeShape& shape() const { return shape_; }
  const MoeOptions& options() const { return options_; }
  /// Router logits [N, E] of the last forward (tests and the reference).
  const Tensor& last_logits() const { return last_logits_; }

 private:
  /// Adds one backward's routing to step_stats_.
  void count_step(const MoeDispatch& d, const MoeRouterLosses& losses);
  /// Steps 3 (and the exchange around it, ep > 1): packed rows → their experts' outputs, in
  /// this rank's packed order; `exchange` receives the plan backward reuses.
  Tensor run_experts(const Tensor& packed, EpExchange& exchange, const MicroBatchContext& ctx);
  /// d_out in packed order → d_packed in packed order, through the owners' experts.
  Tensor experts_backward(const Tensor& d_out, const EpExchange& exchange,
                          const MicroBatchContext& ctx);

  MoeShape shape_;
  MoeOptions options_;
  ExpertParallel ep_;
  MoeTokenGroup tokens_;
  Parameter gate_;
  GroupedSwiGluExperts experts_;
  double loss_grad_scale_ = 1.0;
  MoeStats stats_;
  MoeStepStats step_stats_;
  Tensor last_logits_;
  struct State {
    Tensor x;                       // [N, C] f32 (shared with the caller's input)
    Tensor probs, lse;              // [N, E], [N]
    Tensor top_expert, top_weight;  // [N, k] i32, f32
    MoeDispatch dispatch;
    EpExchange exchange;  // ep > 1
    Tensor expert_out;    // [rows, C], in this rank's packed order
    MoeRouterLosses losses;
  };
  Saved<State> saved_;
};

}  // namespace meshtrain
