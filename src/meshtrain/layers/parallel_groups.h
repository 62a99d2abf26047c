// src/meshtrain/layers/parallel_groups.h
//
// The groups a layer may use, passed as one collection (Megatron-core's ProcessGroupCollection
// idea): tensor parallel (with sequence parallel), context parallel and expert parallel, plus
// the token group of a MoE layer's losses. A group of one rank makes every parallel layer the
// plain one.
//
// Context parallel splits each sequence of T tokens into 2·cp chunks of T/(2·cp) and gives cp
// rank c chunks c and 2·cp−1−c ("zigzag", Megatron-LM's load-balanced split for causal
// attention; Liu et al. 2023 ring attention with the striping idea of Brandon et al. 2023):
// under a causal mask chunk g has g earlier chunks to attend to, so pairing an early chunk with
// a late one gives every rank the same work. A rank's activations hold, per sequence, its
// T/cp local rows: first chunk c's, then chunk 2·cp−1−c's.
#pragma once

#include <cstdint>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/config/layer_modes.h"
#include "meshtrain/layers/tp_regions.h"

namespace meshtrain {

/// The context-parallel group a layer's sequences are split over (nullptr: cp = 1).
struct ContextParallel {
  ProcessGroup* group = nullptr;
  CpCommMode comm = CpCommMode::p2p;  // parallel.cp_comm

  int size() const noexcept { return group ? group->size() : 1; }
  int rank() const noexcept { return group ? group->rank() : 0; }
};

/// Global position (0 ≤ pos < local_len·cp) of local row `row` (0 ≤ row < local_len) of a
/// sequence on cp rank `rank` of `size` (the zigzag split above). local_len = T/cp is even.
/// With size 1 it is `row`.
inline std::int64_t zigzag_position(std::int64_t row, std::int64_t local_len, int rank,
                                    int size) noexcept {
  const std::int64_t chunk = local_len / 2;
  return row < chunk ? rank * chunk + row : (2 * size - 1 - rank) * chunk + (row - chunk);
}

/// The global chunk index (of 2·cp) that half `half` (0 or 1) of cp rank `rank`'s rows hold.
inline int zigzag_chunk(int half, int rank, int size) noexcept {
  return half == 0 ? rank : 2 * size - 1 - rank;
}

/// The expert-parallel group a MoE layer's experts are spread over (nullptr: ep = 1): ep rank
/// e holds experts [e·E/ep, (e+1)·E/ep) and its tokens travel to the other experts' owners by
/// all-to-all (layers/expert_parallel.h). The ep ranks are consecutive dp ranks of one dp × cp
/// group (comm/device_mesh.h).
struct ExpertParallel {
  ProcessGroup* group = nullptr;

  int size() const noexcept { return group ? group->size() : 1; }
  int rank() const noexcept { return group ? group->rank() : 0; }
};

/// The ranks that each hold part of one micro-batch's tokens — the cp group, times tp under
/// sequence parallelism — over which a MoE layer's aux and z losses are taken (nullptr: one
/// rank holds them all). `grad_factor` = cp: the dp × cp mean of the gradients would divide
/// the cp ranks' shares of one micro-batch's loss by cp (tp ranks' shares are summed, as every
/// replicated weight's under sequence parallelism).
struct MoeTokenGroup {
  ProcessGroup* group = nullptr;
  int grad_factor = 1;
};

/// Every group a layer may communicate over. Implicitly made from a TensorParallel (cp = 1,
/// ep = 1), so single-dimension call sites stay as they are.
struct ParallelGroups {
  TensorParallel tp;
  ContextParallel cp;
  ExpertParallel ep;
  MoeTokenGroup moe_tokens;

  ParallelGroups(const TensorParallel& tp_, ContextParallel cp_ = {},  // NOLINT: implicit
                 ExpertParallel ep_ = {}, MoeTokenGroup moe_tokens_ = {})
      : tp(tp_), cp(cp_), ep(ep_), moe_tokens(moe_tokens_) {}
};

}  // namespace meshtrain
