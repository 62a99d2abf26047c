// src/meshtrain/plan/formulas.h
//
// The planner's formulas, each in one place, as pure functions of numbers: wire time of the
// collectives, pipeline bubble per schedule, FLOPs per token. accounting.cpp combines them for
// a layout; tests check each against hand-computed values. Sources are given per function and
// in docs/planner.md. Uses: nothing but the standard library.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/config/config.h"

namespace meshtrain::plan {

// --- Collectives on a ring of n ranks (Patarasuk & Yuan 2009; Thakur et al. 2005, §4;
// seed 002's 2(N−1)/N·D). `bytes` is D, the whole buffer each rank holds (for all-gather: the
// gathered output, n × what each rank contributes); bandwidth in bytes/s per rank and
// direction; latency per message step in s. Every function returns seconds; 0 when n ≤ 1. ---

/// Ring all-reduce: reduce-scatter then all-gather, 2(n−1) steps of D/n each:
/// 2(n−1)/n · D/B + 2(n−1)·α.
double all_reduce_s(double bytes, std::int64_t n, double bandwidth, double latency);
/// Ring reduce-scatter (or all-gather) of a D-byte buffer: (n−1)/n · D/B + (n−1)·α.
double reduce_scatter_s(double bytes, std::int64_t n, double bandwidth, double latency);
double all_gather_s(double bytes, std::int64_t n, double bandwidth, double latency);
/// Pairwise all-to-all, each rank holding D bytes of which (n−1)/n leave it:
/// (n−1)/n · D/B + (n−1)·α.
double all_to_all_s(double bytes, std::int64_t n, double bandwidth, double latency);
/// One point-to-point message: D/B + α.
double p2p_s(double bytes, double bandwidth, double latency);

/// Bytes a ring all-reduce of D bytes moves out of each rank: 2(n−1)/n · D (seed 002: 13B
/// fp16 gradients, 26 GB over 32 ranks → ≈ 50 GB).
double all_reduce_wire_bytes(double bytes, std::int64_t n);

// --- Pipeline bubble: idle fraction of the pipeline ranks over a step, unit costs F = 1,
// BW = 2 (B = W = 1 for zb_h1); docs/pipeline_parallel.md, asserted there by the simulator. ---

/// gpipe, 1f1b: (p−1)/(m+p−1) (Huang et al. 2019, §2.3; Narayanan et al. 2021, §2.2.1);
/// interleaved_1f1b: (p−1)/(v·m+p−1) (Narayanan et al. 2021, §2.2.2);
/// zb_h1: (p−1)/(3m+p−1) (Qi et al. 2023, §3, m ≥ p). 0 when p = 1.
double bubble_fraction(PipelineSchedule schedule, std::int64_t p, std::int64_t m, std::int64_t v);
/// The formula as text, for --explain ("(p−1)/(m+p−1)").
std::string bubble_formula(PipelineSchedule schedule);

/// Micro-batches whose activations pipeline stage `stage` (0-based) of `p` holds at its peak,
/// in units of one micro-batch through all of the stage's layers (docs/pipeline_parallel.md,
/// "in flight"): gpipe m; 1f1b min(p − stage, m); zb_h1 min(p, m); interleaved_1f1b
/// min(2(p − stage − 1) + (v − 1)p + 1, v·m) chunk-micro-batches, divided by v. 1 when p = 1.
double in_flight_micro_batches(PipelineSchedule schedule, std::int64_t p, std::int64_t stage,
                               std::int64_t m, std::int64_t v);

// --- FLOPs (Kaplan et al. 2020, §2.1; Chowdhery et al. 2022, App. B; Narayanan et al. 2021,
// §5.1) ---

/// Model FLOPs per token of a forward and backward: 6·Ψ_mm + 12·L·h·s, where Ψ_mm are the
/// parameters of the matrix products (the blocks' linear weights and the LM head), L layers,
/// h hidden size, s sequence length (the attention scores and their product with V: 2·2·s·h per
/// layer forward, ×3 with backward; causal masking not subtracted, as in the sources).
double model_flops_per_token(double matmul_params, std::int64_t layers, std::int64_t hidden,
                             std::int64_t seq);
/// The FLOPs the hardware runs per token: model FLOPs plus the recomputed forwards —
/// full: + 2·Ψ_blocks + 4·L·h·s (every block's forward again: ×4/3 on the blocks);
/// selective: + 4·L·h·s (the attention core's forward); none: + 0.
double hardware_flops_per_token(double matmul_params, double block_matmul_params,
                                std::int64_t layers, std::int64_t hidden, std::int64_t seq,
                                RecomputeMode recompute);

// --- Memory-bound work ---

/// Time of the attention-score traffic of one pipeline rank per step, for an implementation
/// that materialises the s×s scores (Megatron-LM 2021: the QKᵀ product writes them, the fused
/// scale-mask-softmax and dropout read and write them, the product with V reads them; and the
/// mirror image in backward): bytes_per_element · L · (a/t) · b · s² · m / memory bandwidth.
/// `bytes_per_element` sums the passes (forward, backward, and a recomputed forward). 0 when
/// the bandwidth or the bytes are 0.
double attention_score_s(double bytes_per_element, std::int64_t layers, double heads_per_rank,
                         std::int64_t micro_batch, std::int64_t seq, std::int64_t micro_batches,
                         double memory_bandwidth);

}  // namespace meshtrain::plan
