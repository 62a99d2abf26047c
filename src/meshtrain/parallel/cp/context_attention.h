// src/meshtrain/parallel/cp/context_attention.h
//
// The attention core softmax(q·kᵀ/√d + causal mask)·v of one layer over a context-parallel
// group, exact in every mode (no local-softmax approximation):
//   cp = 1: one call of the tiled kernel (kernels::attention_chunk_forward, mask causal).
//   p2p (ring attention; Liu et al. 2023, §3, with the zigzag split of context_parallel.h):
//     K and V of the local rows travel around the cp ring, cp − 1 hops, each hop's send and
//     receive posted before the current block is computed; the partial results of each
//     (local query chunk, visiting key chunk) pair merge by log-sum-exp. Backward: K, V travel
//     the ring again; dK, dV of a visiting block are accumulated by each rank it visits and
//     travel one step behind it on a second stream, so that their transfer too overlaps the
//     next block's compute; a final hop brings each block's dK, dV home (cp sends).
//   a2a (DeepSpeed-Ulysses; Jacobs et al. 2023, §3.1): one all-to-all turns q, k, v from
//     sequence-sharded [T/cp rows, all local heads] into head-sharded [T rows, heads/cp], the
//     kernel runs on whole sequences, and one all-to-all brings the output back; backward the
//     mirror images (dout forward, dq/dk/dv back). Needs heads and kv heads divisible by cp
//     (validated with the config).
// Bytes per layer and micro-batch are in docs/context_parallel.md; tests/dist/cp_* check them.
#pragma once

#include <cstdint>

#include "meshtrain/core/tensor.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/parallel/cp/context_parallel.h"

namespace meshtrain {

/// One layer's attention on this rank: `sequences` sequences of `local_len` = T/cp rows each
/// (the zigzag rows of context_parallel.h), `heads` / `kv_heads` heads of `head_dim` on this tp
/// rank; `operands` the tile GEMM operand precision of every kernel call (f32 or bf16,
/// kernels::AttentionChunkDims::operands; attention_operands in layers/autocast.h picks it).
struct AttentionCoreShape {
  std::int64_t sequences;
  std::int64_t local_len;
  std::int64_t heads;
  std::int64_t kv_heads;
  std::int64_t head_dim;
  DType operands = DType::f32;
  std::int64_t tokens() const { return sequences * local_len; }
};

/// What backward needs besides q, k, v and the output (MemCategory::activations, f32).
struct AttentionCoreState {
  Tensor lse;  // cp = 1 and p2p: [sequences, heads, local_len]; a2a: [sequences, heads/cp, T]
  // a2a: the head-sharded whole sequences the kernel ran on, rows in sequence order:
  // q and out [sequences·T, heads/cp·d], kv [sequences·T, 2·kv_heads/cp·d] (k | v).
  Tensor q, kv, out;
};

/// in: q [tokens, heads·d], k, v [tokens, kv_heads·d] (row strides as QkvRows) →
/// out [tokens, heads·d] (row stride heads·d) overwritten; returns the kept state. RoPE and
/// positions are the caller's: q and k arrive rotated by their global positions. Collective
/// over cp.group (every cp rank calls it for the same layer in the same order). Adds the
/// seconds spent in the core's kernels (the tiled attention, merges, deltas; not the waits
/// for K/V) to `compute_s`, the calling layer's counter: set against the cp group's wait
/// seconds (ProcessGroup counters), it says how much of the transfer the compute hid
/// (bench/cp_bench.sh).
AttentionCoreState attention_core_forward(const ContextParallel& cp, const kernels::QkvRows& in,
                                          const AttentionCoreShape& shape, float* out,
                                          double& compute_s);

/// dout [tokens, heads·d] (stride heads·d), out and state from forward → dq, dk, dv of the
/// local rows, OVERWRITTEN (head columns only). Collective over cp.group. Adds its kernel
/// seconds to `compute_s` as forward does.
void attention_core_backward(const ContextParallel& cp, const kernels::QkvRows& in,
                             const float* out, const float* dout, const AttentionCoreState& state,
                             const kernels::QkvGradRows& grad, const AttentionCoreShape& shape,
                             double& compute_s);

}  // namespace meshtrain
