// src/meshtrain/config/layer_modes.h
//
// The config enums that layers/ takes as they are (one type each, shared by the config
// loader, the planner and the layers, so no layer keeps a twin and nothing maps between them).
#pragma once

#include <array>
#include <cstdint>

#include "meshtrain/config/enum_names.h"

namespace meshtrain {

// training.recompute: activation recompute (Korthikanti et al. 2022, §5), what a forward drops
// and its backward computes again. Every mode runs the same kernels on the same values in the
// same order, so losses and gradients are bitwise those of `none`.
//   none: keep everything backward needs
//   selective: drop the attention core's output and log-sum-exp; recompute them from the kept
//     q, k, v (CausalSelfAttention)
//   full: keep only each block's input; run the whole block again (TransformerBlock)
enum class RecomputeMode : std::uint8_t { none, selective, full };
inline constexpr std::array<EnumName<RecomputeMode>, 3> kRecomputeModeNames{{
    {RecomputeMode::none, "none", "keep every activation"},
    {RecomputeMode::selective, "selective", "the attention core"},
    {RecomputeMode::full, "full", "whole blocks"},
}};
constexpr const auto& enum_names(RecomputeMode) { return kRecomputeModeNames; }

// parallel.cp_comm: how attention sees the other cp ranks' keys and values.
//   p2p: ring attention, K and V rotate around the cp ring (parallel/cp/context_attention.h)
//   a2a: Ulysses, all-to-all from sequence-sharded to head-sharded and back
enum class CpCommMode : std::uint8_t { p2p, a2a };
inline constexpr std::array<EnumName<CpCommMode>, 2> kCpCommModeNames{{
    {CpCommMode::p2p, "p2p", "ring attention"},
    {CpCommMode::a2a, "a2a", "Ulysses all-to-all"},
}};
constexpr const auto& enum_names(CpCommMode) { return kCpCommModeNames; }

// model.moe_token_drop_policy: which assignments an over-full expert keeps (Megatron-LM's
// `moe_token_drop_policy`, moe_utils.topk_softmax_with_capacity; transformer/moe_routing.h).
//   probs: the `capacity` assignments of highest combine weight (the renormalised top-k
//     probability the token would be weighted by); ties: the earlier token
//   position: the first `capacity` assignments in token order
enum class MoeDropPolicy : std::uint8_t { probs, position };
inline constexpr std::array<EnumName<MoeDropPolicy>, 2> kMoeDropPolicyNames{{
    {MoeDropPolicy::probs, "probs", "the highest router weights"},
    {MoeDropPolicy::position, "position", "the earliest tokens"},
}};
constexpr const auto& enum_names(MoeDropPolicy) { return kMoeDropPolicyNames; }

MESHTRAIN_CONFIG_ENUM_JSON(RecomputeMode)
MESHTRAIN_CONFIG_ENUM_JSON(CpCommMode)
MESHTRAIN_CONFIG_ENUM_JSON(MoeDropPolicy)

}  // namespace meshtrain
