// src/meshtrain/parallel/ep/expert_parallel.h
//
// Expert parallel's token exchange (GShard, Lepikhin et al. 2021, §2.2: dispatch and combine
// as all-to-all; Megatron-core's MoEAlltoAllTokenDispatcher). Each ep rank routes its own
// tokens over all E experts (moe_routing.h: a packed buffer grouped by expert, expert 0's rows
// first), and ep rank e owns experts [e·L, (e+1)·L), L = E/ep, so the packed buffer is already
// ordered by owner. The exchange:
//   1. counts: an all-to-all of the per-expert row counts (L to each rank), so every owner
//      knows how many rows each source sends to each of its experts; the all_to_allv sizes
//      below always come from these exchanged counts, never from a local guess;
//   2. dispatch: all_to_allv of the rows (source-major on arrival: source 0's rows for local
//      experts 0 … L−1, then source 1's, …), then a permutation to expert-major (local expert
//      0's rows from every source in source order, …), which GroupedSwiGluExperts reads;
//   3. combine: the inverse permutation and the all_to_allv back, so each source gets its rows'
//      outputs in its own packed order.
// Backward runs the same two moves on gradients: the output gradient is dispatched like the
// input was, the input gradient is combined like the output was.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {

/// The expert-parallel group a MoE layer's experts are spread over (nullptr: ep = 1): ep rank
/// e holds experts [e·E/ep, (e+1)·E/ep) and its tokens travel to the other experts' owners by
/// all-to-all (the exchange below). The ep ranks are consecutive dp ranks of one dp × cp group
/// (comm/device_mesh.h).
struct ExpertParallel {
  ProcessGroup* group = nullptr;

  int size() const noexcept { return group ? group->size() : 1; }
  int rank() const noexcept { return group ? group->rank() : 0; }
};

/// One forward's exchange plan on this rank of the ep group.
struct EpExchange {
  int ep = 1;
  std::int64_t local_experts = 0;          // L = E/ep
  std::vector<std::int64_t> send_counts;   // [ep] rows this rank sends to each owner
  std::vector<std::int64_t> recv_counts;   // [ep] rows each source sends to this rank
  std::vector<std::int64_t> local_counts;  // [L] rows per local expert, all sources
  // [received rows] expert-major position of each received (source-major) row.
  std::vector<std::int64_t> to_expert_major;

  std::int64_t rows_received() const { return static_cast<std::int64_t>(to_expert_major.size()); }
};

/// Exchanges `counts` [E] (rows per expert in this rank's packed buffer; E % ep.size() == 0,
/// MT_CHECKed) over `ep` and plans the moves. Collective over ep (one all_to_all of E int32
/// counts).
EpExchange plan_ep_exchange(ProcessGroup& ep, std::span<const std::int64_t> counts);

/// rows [Σ send_counts, C] f32 in this rank's packed order → [rows_received, C] f32,
/// expert-major over the local experts. Collective over ep (all_to_allv).
Tensor ep_dispatch(ProcessGroup& ep, const EpExchange& plan, const Tensor& rows);

/// rows [rows_received, C] f32, expert-major → [Σ send_counts, C] f32 in this rank's packed
/// order (each row back at its source). Collective over ep (all_to_allv).
Tensor ep_combine(ProcessGroup& ep, const EpExchange& plan, const Tensor& rows);

}  // namespace meshtrain
