// src/meshtrain/transformer/moe_routing.h
//
// The host-side half of a sparse MoE layer (transformer/moe.h): from each token's top-k experts and
// weights to the dispatch plan — which (token, expert) assignments are kept under the expert
// capacity, how many rows each expert receives, and the order of the rows in the packed buffer
// the experts read — plus the two router losses. Pure functions of plain arrays, so the
// capacity rule is tested on hand-made routings and expert parallel can split the dispatch at
// "counts per expert → exchange → run local experts → return" (the counts and the row order are
// all an all-to-all needs).
//
// Vocabulary: N tokens (the rows of the micro-batch the layer sees), E experts, k = top_k; token
// n's assignments a = n·k + j, j = 0 … k−1 in decreasing router probability.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "meshtrain/config/layer_modes.h"

namespace meshtrain {

/// Expert capacity (Switch Transformer, Fedus et al. 2021, §2.2 eq. 3 "expert capacity =
/// (tokens per batch / number of experts) × capacity factor", with tokens counted as
/// top_k assignments each as Megatron-LM's get_capacity(num_tokens · topk, E, factor)):
///   capacity = ⌈(tokens · top_k / E) · capacity_factor⌉, evaluated in double in that order.
/// capacity_factor = 0 means dropless: returns nullopt (no limit). MT_CHECKs tokens ≥ 0,
/// top_k ≥ 1, E ≥ 1, capacity_factor ≥ 0.
std::optional<std::int64_t> moe_expert_capacity(std::int64_t tokens, std::int64_t top_k,
                                                std::int64_t experts, double capacity_factor);

/// Where every assignment goes. Packed rows are grouped by expert (expert 0's rows first), and
/// within an expert in token order (a stable sort), whatever the drop policy.
struct MoeDispatch {
  std::int64_t tokens = 0, top_k = 0, experts = 0;
  std::optional<std::int64_t> capacity;  // nullopt: dropless
  std::vector<std::int64_t> routed;      // [E] assignments the router chose, before dropping
  std::vector<std::int64_t> counts;      // [E] assignments kept = packed rows per expert
  std::vector<std::int64_t> offsets;     // [E + 1] first packed row of each expert; back = rows
  std::vector<std::int32_t> assign_row;  // [N·k] packed row of assignment a, −1 if dropped
  std::vector<std::int32_t> row_token;   // [rows] token of each packed row

  std::int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  std::int64_t dropped() const { return tokens * top_k - rows(); }
};

/// The dispatch of a routing: top_expert [N·k] (distinct experts per token, each in [0, E)),
/// top_weight [N·k] (read by MoeDropPolicy::probs only), capacity from
/// moe_expert_capacity. MT_CHECKs the sizes and the expert indices.
MoeDispatch plan_moe_dispatch(std::span<const std::int32_t> top_expert,
                              std::span<const float> top_weight, std::int64_t tokens,
                              std::int64_t top_k, std::int64_t experts,
                              std::optional<std::int64_t> capacity, MoeDropPolicy policy);

/// The router losses of one forward, from probs [N, E] (the full softmax) and lse [N].
///   load balance (Switch Transformer §2.2 eq. 4–6; Megatron-LM switch_load_balancing_loss_func):
///     aux = coeff · E · Σᵢ fᵢ·Pᵢ, fᵢ = routedᵢ / (N·k) the fraction of the N·k assignments the
///     router sent to expert i, counted BEFORE capacity dropping (Megatron's tokens_per_expert
///     comes from the top-k map, not the dropped one), Pᵢ = (1/N) Σₙ probs[n, i]. fᵢ is a count:
///     no gradient flows through it. Uniform routing gives E·Σ fᵢ/E = 1 (times coeff).
///   z-loss (ST-MoE, Zoph et al. 2022, §3.2 eq. 5): z = coeff · (1/N) Σₙ lse[n]².
struct MoeRouterLosses {
  double load_balance = 0.0;  // E·Σ fᵢPᵢ (1 for a uniform router; reported whatever coeff)
  double aux_loss = 0.0;      // moe_aux_loss_coeff · load_balance
  double router_z = 0.0;      // (1/N) Σ lse²
  double z_loss = 0.0;        // moe_z_loss_coeff · router_z
  /// ∂aux/∂probs[n, i] = coeff·E·fᵢ/N (the same for every token), [E]. Empty when coeff = 0.
  std::vector<float> aux_dprob;
  /// ∂z/∂logits[n, i] = z_scale·lse[n]·probs[n, i], z_scale = 2·coeff/N.
  float z_scale = 0.0f;
};
/// MT_CHECKs routed.size() = E ≥ 1, top_k ≥ 1, tokens ≥ 0; tokens = 0 gives all zeros.
/// The composition of the two functions below.
MoeRouterLosses moe_router_losses(const float* probs, const float* lse,
                                  std::span<const std::int64_t> routed, std::int64_t tokens,
                                  std::int64_t top_k, double aux_loss_coeff, double z_loss_coeff);
/// What the losses are made of, over the N tokens given: [routedᵢ (E), Σₙ probs[n, i] (E),
/// Σₙ lse[n]², N] — sums over tokens, so ranks that each hold part of one micro-batch (context
/// parallel, sequence parallel) all-reduce them and get the micro-batch's losses (Megatron-LM
/// reduces the counts over tp × cp the same way). MT_CHECKs E ≥ 1, tokens ≥ 0.
std::vector<double> moe_router_sums(const float* probs, const float* lse,
                                    std::span<const std::int64_t> routed, std::int64_t tokens);
/// The losses (and their gradient factors, per token of the sums' N) from `sums` as
/// moe_router_sums returns them, summed over any number of token sets.
MoeRouterLosses moe_router_losses_from_sums(std::span<const double> sums, std::int64_t top_k,
                                            double aux_loss_coeff, double z_loss_coeff);

}  // namespace meshtrain
