// src/meshtrain/kernels/cpu/vocab_cross_entropy.cpp
//
// Softmax cross-entropy over the vocabulary (PyTorch F.cross_entropy without label smoothing):
// loss_r = lse_r − logit[r, target_r], lse_r = log Σ_j exp(logit[r, j]), computed in
// vocabulary-parallel pieces (Megatron-LM's VocabParallelCrossEntropy, Shoeybi et al. 2019,
// "Megatron-LM", §3, the output embedding GEMM paragraph). A rank holds the logits of
// vocabulary ids [first, first + valid) in columns [0, valid) of a V_local-wide row; the layer
// all-reduces the max, then Σ exp(z − max) and the target's logit, and forms
//   lse = max + log Σ_ranks sum_exp,   loss = lse − target_logit.
// This is the log-sum-exp trick split over column ranges: log Σ exp(z_j) = m + log Σ exp(z_j − m)
// with m = max z, so every exponent is ≤ 0 (no overflow) and the largest term is exactly 1 (the
// sum cannot underflow to 0). Each partial sum runs in double: a 50k-entry vocabulary would
// otherwise lose ≈ √V·ε_f32 to rounding. The exps are cpu::exp_approx (< 1 ulp, vector_math.h)
// and the max, the sums and the backward run in vector lanes (OpenMP simd reductions, a fixed
// order for a given build and row length): glibc's scalar expf made these kernels ≈ 48 % of
// the GPT-2 BPE job's step (V = 50,257; perf on 1 Zen 5 core), and the step took 470 ms
// against 265 with them vectorised. One shard (first = 0, valid = V) is the unsharded loss.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/vector_math.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

void check_dims(std::int64_t rows, std::int64_t V_local, std::int64_t valid, const char* what) {
  MT_CHECK(rows >= 0 && V_local >= 0 && valid >= 0 && valid <= V_local,
           "{}: bad dims rows={} V_local={} valid={}", what, rows, V_local, valid);
}

// −inf is the identity of the max all-reduce: a rank without vocabulary rows does not move the
// global max.
// A max is exact whatever the order, so the lanes' maxima give the sequential one's value.
inline float row_max_of(const float* row, std::int64_t valid) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (std::int64_t j = 0; j < valid; ++j) m = row[j] > m ? row[j] : m;
  return m;
}

// Σ exp(z − m) in double (see the file comment) and the target's logit (0 off this shard).
inline void row_sum_exp(const float* row, float m, std::int32_t target, std::int64_t first,
                        std::int64_t valid, float* sum_exp, float* target_logit) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < valid; ++j) sum += static_cast<double>(cpu::exp_approx(row[j] - m));
  *sum_exp = static_cast<float>(sum);
  const std::int64_t local = static_cast<std::int64_t>(target) - first;
  *target_logit = local >= 0 && local < valid ? row[local] : 0.0f;
}

}  // namespace

void vocab_shard_max(const float* logits, std::int64_t rows, std::int64_t V_local,
                     std::int64_t valid, float* row_max) {
  check_dims(rows, V_local, valid, "vocab_shard_max");
#pragma omp parallel for schedule(static) if (rows * valid >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    row_max[r] = row_max_of(logits + r * V_local, valid);
  }
}

void vocab_shard_sum_exp(const float* logits, const float* row_max, const std::int32_t* targets,
                         std::int64_t first, std::int64_t rows, std::int64_t V_local,
                         std::int64_t valid, float* sum_exp, float* target_logit) {
  check_dims(rows, V_local, valid, "vocab_shard_sum_exp");
  MT_CHECK(first >= 0, "vocab_shard_sum_exp: first={} is negative", first);
#pragma omp parallel for schedule(static) if (rows * valid >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * V_local;
    const std::int32_t target = targets[r];
    MT_CHECK(target >= 0, "vocab_shard_sum_exp: target {} of row {} is negative", target, r);
    // row_max is the global max (after the all-reduce), so every exponent is ≤ 0 and the
    // rank holding the max contributes a term of exactly 1. The sum runs in double (≈ √V·ε_f32
    // of rounding otherwise); it is stored as f32 for the all-reduce, one rounding of a sum
    // that is ≥ 1 once all ranks' parts are added.
    // Zero on the ranks that do not hold the target: the sum all-reduce then yields its logit.
    row_sum_exp(row, row_max[r], target, first, valid, sum_exp + r, target_logit + r);
  }
}

void vocab_softmax_stats(const float* logits, const std::int32_t* targets, std::int64_t rows,
                         std::int64_t V, float* row_max, float* sum_exp, float* target_logit) {
  check_dims(rows, V, V, "vocab_softmax_stats");
  // One pass over the logits: each row's max and Σ exp while the row is in L1 (the two-kernel
  // form reads every row twice, with a parallel region each). The same row helpers as
  // vocab_shard_max / vocab_shard_sum_exp, so the same bits.
#pragma omp parallel for schedule(static) if (rows * V >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * V;
    MT_CHECK(targets[r] >= 0, "vocab_softmax_stats: target {} of row {} is negative", targets[r],
             r);
    row_max[r] = row_max_of(row, V);
    row_sum_exp(row, row_max[r], targets[r], 0, V, sum_exp + r, target_logit + r);
  }
}

void vocab_shard_cross_entropy_backward(const float* logits, const float* lse,
                                        const std::int32_t* targets, std::int64_t first,
                                        float scale, float* dlogits, std::int64_t rows,
                                        std::int64_t V_local, std::int64_t valid) {
  check_dims(rows, V_local, valid, "vocab_shard_cross_entropy_backward");
  MT_CHECK(first >= 0, "vocab_shard_cross_entropy_backward: first={} is negative", first);
  // ∂loss_r/∂z_j = softmax(z)_j − [first + j = target], softmax(z)_j = exp(z_j − lse) with the
  // global lse. Rounded per column alone (scale·p, then − scale at the target), so a shard's
  // columns equal the matching columns of the one-shard gradient bit for bit. Each element is
  // read before it is written at the same index (dlogits may alias logits; no __restrict here
  // on purpose).
#pragma omp parallel for schedule(static) if (rows * V_local >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * V_local;
    float* drow = dlogits + r * V_local;
    const float row_lse = lse[r];
    const std::int32_t target = targets[r];
    MT_CHECK(target >= 0, "vocab_shard_cross_entropy_backward: target {} of row {} is negative",
             target, r);
#pragma omp simd
    for (std::int64_t j = 0; j < valid; ++j) drow[j] = scale * cpu::exp_approx(row[j] - row_lse);
    // Padding columns get an exact zero: their logits are garbage (an inf or NaN there must not
    // reach the lm_head weight gradient).
    std::fill(drow + valid, drow + V_local, 0.0f);
    const std::int64_t local = static_cast<std::int64_t>(target) - first;
    if (local >= 0 && local < valid) drow[local] -= scale;
  }
}

}  // namespace meshtrain::kernels
