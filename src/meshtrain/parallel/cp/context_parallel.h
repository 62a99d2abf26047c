// src/meshtrain/parallel/cp/context_parallel.h
//
// The context-parallel group and how it splits a sequence.
//
// Context parallel splits each sequence of T tokens into 2·cp chunks of T/(2·cp) and gives cp
// rank c chunks c and 2·cp−1−c ("zigzag", Megatron-LM's load-balanced split for causal
// attention; Liu et al. 2023 ring attention with the striping idea of Brandon et al. 2023):
// under a causal mask chunk g has g earlier chunks to attend to, so pairing an early chunk with
// a late one gives every rank the same work. A rank's activations hold, per sequence, its
// T/cp local rows: first chunk c's, then chunk 2·cp−1−c's.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/config/layer_modes.h"

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

/// Rows of `full` ([sequences, seq_len] tokens) that cp rank `cp_rank` of `cp_size` holds, in
/// its local order: per sequence chunk cp_rank, then chunk 2·cp_size−1−cp_rank.
std::vector<std::int32_t> zigzag_rows(const std::vector<std::int32_t>& full, std::int64_t sequences,
                                      std::int64_t seq_len, int cp_rank, int cp_size);

}  // namespace meshtrain
