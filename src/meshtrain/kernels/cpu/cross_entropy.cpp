// src/meshtrain/kernels/cpu/cross_entropy.cpp
//
// Softmax cross-entropy over the last dim (PyTorch F.cross_entropy without label smoothing):
// loss_r = lse_r − logit[r, target_r], lse_r = log Σ_j exp(logit[r, j]).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* losses,
                           float* lse, std::int64_t rows, std::int64_t V) {
  MT_CHECK(rows >= 0 && V > 0, "cross_entropy_forward: bad dims rows={} V={}", rows, V);
#pragma omp parallel for schedule(static) if (rows * V >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * V;
    const std::int32_t target = targets[r];
    MT_CHECK(target >= 0 && target < V, "cross_entropy_forward: target {} of row {} not in [0, {})",
             target, r, V);
    // log Σ exp(z_j) = m + log Σ exp(z_j − m) with m = max z: every exponent ≤ 0, so no
    // overflow, and the largest term is exactly 1, so the sum cannot underflow to 0.
    float m = row[0];
    for (std::int64_t j = 1; j < V; ++j) m = std::max(m, row[j]);
    // The sum runs in double: a 50k-entry vocabulary would otherwise lose ≈ √V·ε_f32 to
    // rounding, and the exps dominate the cost anyway.
    double sum = 0.0;
    for (std::int64_t j = 0; j < V; ++j) sum += static_cast<double>(std::exp(row[j] - m));
    const float row_lse = m + static_cast<float>(std::log(sum));
    lse[r] = row_lse;
    losses[r] = row_lse - row[target];
  }
}

void cross_entropy_backward(const float* logits, const float* lse, const std::int32_t* targets,
                            float scale, float* dlogits, std::int64_t rows, std::int64_t V) {
  MT_CHECK(rows >= 0 && V > 0, "cross_entropy_backward: bad dims rows={} V={}", rows, V);
  // ∂loss_r/∂z_j = softmax(z)_j − [j = target] with softmax(z)_j = exp(z_j − lse). Each
  // element is read before it is written at the same index, which is what lets dlogits alias
  // logits (no __restrict here on purpose).
#pragma omp parallel for schedule(static) if (rows * V >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * V;
    float* drow = dlogits + r * V;
    const float row_lse = lse[r];
    const std::int32_t target = targets[r];
    MT_CHECK(target >= 0 && target < V,
             "cross_entropy_backward: target {} of row {} not in [0, {})", target, r, V);
    for (std::int64_t j = 0; j < V; ++j) drow[j] = scale * std::exp(row[j] - row_lse);
    drow[target] -= scale;
  }
}

}  // namespace meshtrain::kernels
