// src/meshtrain/plan/context_parallel.h
//
// Context parallel (cp) in the planner: the rules a cp layout must follow, and what cp adds to
// the account — the attention traffic on the cp group per step (ring attention "p2p" or
// Ulysses all-to-all "a2a", parallel.cp_comm), its wire time, and its buffers. What cp changes
// in the other terms lives with them in accounting.cpp: every per-token activation is for
// local_tokens() = b·s/cp tokens, and gradients and ZeRO are over the dp × cp group
// (reduction_group_size). The runtime design these formulas follow: shared/DESIGN.md ("The
// mesh") and docs/context_parallel.md; docs/planner.md ("Context parallel") derives each one.
// Uses: config, plan/accounting, plan/formulas.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/accounting.h"

namespace meshtrain::plan {

/// Tokens of one micro-batch that one rank holds activations for: b·s/cp. Each sequence is cut
/// into 2·cp chunks and cp rank c keeps chunks c and 2cp−1−c (zigzag: every rank gets the same
/// causal work), so every rank holds s/cp tokens of each of its b sequences.
double local_tokens(const Config& config);

/// The group gradients are reduced over and ZeRO shards over: dp × cp ranks (the cp ranks of a
/// dp rank hold the same weights and see different tokens of the same sequences).
std::int64_t reduction_group_size(const Config& config);

/// One kind of message of the cp traffic: `count` blocks of `bytes` each, per transformer
/// block and micro-batch, as the cp group's ProcessGroup counters count them (p2p: the bytes
/// sent; all-to-all: the input handed to the op).
struct CpMessage {
  std::string what;
  double count = 0.0;
  double bytes = 0.0;
};

/// The cp messages of one transformer block and micro-batch on one rank. With
/// K = 2·b·(s/cp)·(kv/t)·4 (K and V of the local tokens, fp32 on the wire in every precision):
///   p2p forward: K,V (cp−1)×K (each rank passes its neighbour's block on, cp−1 ring steps);
///       backward: K,V (cp−1)×K again and dK,dV cp×K (they accumulate around the ring and the
///       last hop brings them home); full or selective recompute reruns the forward ring in
///       backward: + (cp−1)×K.
///   a2a forward: all-to-alls of q (b·(s/cp)·(h/t)·4), k and v (b·(s/cp)·(kv/t)·4 each) from
///       sequence- to head-sharded, and of the output (q's size) back; backward: the mirror
///       images (d out in, dq, dk, dv back); full recompute reruns the forward's four (selective
///       recomputes the attention core from the head-sharded q, k, v it kept: no all-to-all).
/// Empty when cp = 1.
struct CpLayerTraffic {
  std::vector<CpMessage> forward, backward;
};
CpLayerTraffic cp_layer_traffic(const Config& config);

/// cp bytes per step and rank: m · L · Σ count·bytes over forward and backward (L the blocks of
/// the stage). 0 when cp = 1.
double cp_bytes_per_step(const Config& config, const ParameterCounts& stage_params);

/// Their wire time per step on `link`: p2p messages D/B + α each; all-to-alls
/// (cp−1)/cp·D/B + (cp−1)·α each (formulas.h); time.activation_wire_bytes / 4 scales the
/// bytes (an implementation that sends 16-bit activations). Seconds; 0 when cp = 1.
double cp_time_per_step(const Config& config, const ParameterCounts& stage_params,
                        const Link& link, const TimeSettings& time = {});

/// The cp buffers (MemCategory::comm), bytes. p2p: the ring's receive buffers are double
/// buffered (the block in use and the next one arriving): 2 K,V blocks in forward; backward
/// also double-buffers the travelling dK,dV, so the peak is 4 blocks of K = 2·b·(s/cp)·(kv/t)·4.
/// a2a: one layer's q, k, v in the other sharding while the all-to-all runs,
/// 4·b·(s/cp)·(h + 2kv)/t. 0 when cp = 1.
double cp_comm_buffer_bytes(const Config& config);

/// The formula of cp_time_per_step as text, for --explain.
std::string cp_time_formula(const Config& config);

}  // namespace meshtrain::plan
