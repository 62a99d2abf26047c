// src/meshtrain/kernels/cpu/vocab_cross_entropy.cpp
//
// Vocabulary-parallel softmax cross-entropy pieces (Megatron-LM's VocabParallelCrossEntropy,
// Shoeybi et al. 2019, "Megatron-LM", §3, the output embedding GEMM paragraph). A rank holds
// the logits of vocabulary ids [first, first + valid) in columns [0, valid) of a V_local-wide
// row; the layer all-reduces the max, then Σ exp(z − max) and the target's logit, and forms
//   lse = max + log Σ_ranks sum_exp,   loss = lse − target_logit,
// the same log-sum-exp trick as cross_entropy_forward, split over column ranges. exp and the
// double-precision sum are those of cross_entropy_forward/backward, so a single shard holding
// the whole vocabulary reproduces their terms bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

void check_dims(std::int64_t rows, std::int64_t V_local, std::int64_t valid, const char* what) {
  MT_CHECK(rows >= 0 && V_local >= 0 && valid >= 0 && valid <= V_local,
           "{}: bad dims rows={} V_local={} valid={}", what, rows, V_local, valid);
}

}  // namespace

void vocab_shard_max(const float* logits, std::int64_t rows, std::int64_t V_local,
                     std::int64_t valid, float* row_max) {
  check_dims(rows, V_local, valid, "vocab_shard_max");
#pragma omp parallel for schedule(static) if (rows * valid >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * V_local;
    // −inf is the identity of the max all-reduce: a rank without vocabulary rows does not
    // move the global max.
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < valid; ++j) m = std::max(m, row[j]);
    row_max[r] = m;
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
    // rank holding the max contributes a term of exactly 1. The sum runs in double as in
    // cross_entropy_forward (≈ √V·ε_f32 of rounding otherwise); it is stored as f32 for the
    // all-reduce, one rounding of a sum ≥ 1.
    const float m = row_max[r];
    double sum = 0.0;
    for (std::int64_t j = 0; j < valid; ++j) sum += static_cast<double>(std::exp(row[j] - m));
    sum_exp[r] = static_cast<float>(sum);
    const std::int64_t local = static_cast<std::int64_t>(target) - first;
    // Zero on the ranks that do not hold the target: the sum all-reduce then yields its logit.
    target_logit[r] = local >= 0 && local < valid ? row[local] : 0.0f;
  }
}

void vocab_shard_cross_entropy_backward(const float* logits, const float* lse,
                                        const std::int32_t* targets, std::int64_t first,
                                        float scale, float* dlogits, std::int64_t rows,
                                        std::int64_t V_local, std::int64_t valid) {
  check_dims(rows, V_local, valid, "vocab_shard_cross_entropy_backward");
  MT_CHECK(first >= 0, "vocab_shard_cross_entropy_backward: first={} is negative", first);
  // ∂loss_r/∂z_j = softmax(z)_j − [first + j = target], softmax(z)_j = exp(z_j − lse) with the
  // global lse. Rounded as cross_entropy_backward (scale·p, then − scale at the target), so a
  // shard's columns equal the matching columns of the unsharded gradient bit for bit. Each
  // element is read before it is written at the same index (dlogits may alias logits).
#pragma omp parallel for schedule(static) if (rows * V_local >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * V_local;
    float* drow = dlogits + r * V_local;
    const float row_lse = lse[r];
    const std::int32_t target = targets[r];
    MT_CHECK(target >= 0, "vocab_shard_cross_entropy_backward: target {} of row {} is negative",
             target, r);
    for (std::int64_t j = 0; j < valid; ++j) drow[j] = scale * std::exp(row[j] - row_lse);
    // Padding columns get an exact zero: their logits are garbage (an inf or NaN there must not
    // reach the lm_head weight gradient).
    std::fill(drow + valid, drow + V_local, 0.0f);
    const std::int64_t local = static_cast<std::int64_t>(target) - first;
    if (local >= 0 && local < valid) drow[local] -= scale;
  }
}

}  // namespace meshtrain::kernels
