// src/meshtrain/kernels/cpu/layernorm.cpp
//
// LayerNorm over the last dim (Ba et al. 2016, "Layer Normalization", eq. 4; PyTorch
// nn.LayerNorm: biased variance, eps inside the square root).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

namespace {

// One row of the forward: shared by the plain and the residual-fused kernels, so the two are
// the same float operations in the same order (bitwise equal, fused_kernels_test).
inline void layernorm_row(const float* xr, const float* weight, const float* bias, float* yr,
                          float* mean, float* rstd, std::int64_t C, float inv_c, float eps) {
  float sum = 0.0f;
  for (std::int64_t c = 0; c < C; ++c) sum += xr[c];
  const float mu = sum * inv_c;
  // Two passes (mean, then squared deviations) instead of E[x²] − E[x]²: the one-pass
  // form cancels catastrophically when |mean| ≫ std, as for residual streams late in training.
  float sq = 0.0f;
  for (std::int64_t c = 0; c < C; ++c) {
    const float d = xr[c] - mu;
    sq += d * d;
  }
  const float rs = 1.0f / std::sqrt(sq * inv_c + eps);
  *mean = mu;
  *rstd = rs;
  if (bias != nullptr) {
    for (std::int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * weight[c] + bias[c];
  } else {
    for (std::int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * weight[c];
  }
}

}  // namespace

void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                       float* mean, float* rstd, std::int64_t rows, std::int64_t C, float eps) {
  MT_CHECK(rows >= 0 && C > 0, "layernorm_forward: bad dims rows={} C={}", rows, C);
  const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    layernorm_row(x + r * C, weight, bias, y + r * C, mean + r, rstd + r, C, inv_c, eps);
  }
}

void residual_layernorm_forward(const float* a, const float* b, float* h, const float* weight,
                                const float* bias, float* y, float* mean, float* rstd,
                                std::int64_t rows, std::int64_t C, float eps) {
  MT_CHECK(rows >= 0 && C > 0, "residual_layernorm_forward: bad dims rows={} C={}", rows, C);
  const float inv_c = 1.0f / static_cast<float>(C);
  // The row of h is written and normalised while it is in L1: one pass over memory instead of
  // add_inplace's read-modify-write followed by the norm's reads.
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* hr = h + r * C;
    const float* ar = a + r * C;
    const float* br = b + r * C;
    for (std::int64_t c = 0; c < C; ++c) hr[c] = ar[c] + br[c];
    layernorm_row(hr, weight, bias, y + r * C, mean + r, rstd + r, C, inv_c, eps);
  }
}

void layernorm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                        const float* dy, float* dx, float* dweight, float* dbias, std::int64_t rows,
                        std::int64_t C) {
  layernorm_backward(x, weight, mean, rstd, dy, nullptr, dx, dweight, dbias, rows, C);
}

void layernorm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                        const float* dy, const float* dresidual, float* dx, float* dweight,
                        float* dbias, std::int64_t rows, std::int64_t C) {
  MT_CHECK(rows >= 0 && C > 0, "layernorm_backward: bad dims rows={} C={}", rows, C);
  const float inv_c = 1.0f / static_cast<float>(C);
  // With x̂ = (x − μ)·rstd and g = dy ∘ weight, differentiating through μ and rstd gives
  //   dx = rstd · (g − mean(g) − x̂ · mean(g ∘ x̂))
  // (the form llm.c's layernorm_backward uses; each row is independent).
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float mu = mean[r];
    const float rs = rstd[r];
    float g_sum = 0.0f;
    float gx_sum = 0.0f;
    for (std::int64_t c = 0; c < C; ++c) {
      const float g = dyr[c] * weight[c];
      g_sum += g;
      gx_sum += g * (xr[c] - mu) * rs;
    }
    const float g_mean = g_sum * inv_c;
    const float gx_mean = gx_sum * inv_c;
    for (std::int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mu) * rs;
      dxr[c] = rs * (dyr[c] * weight[c] - g_mean - xhat * gx_mean);
    }
    // The residual's gradient is added in its own loop over the row (still in L1), after the
    // row is stored: a separate rounding, as add_inplace after the norm had it (in one
    // expression the compiler may contract rs·(…) + dresidual into an FMA: not bitwise).
    if (dresidual != nullptr) {
      const float* dr = dresidual + r * C;
      for (std::int64_t c = 0; c < C; ++c) dxr[c] += dr[c];
    }
  }

  // dweight += Σ_r dy ∘ x̂ and dbias += Σ_r dy are sums over rows: threads own column blocks
  // so nothing races and the summation order does not depend on the thread count.
  cpu::for_each_column_block(rows, C, [&](std::int64_t c0, std::int64_t width) {
    float dw_acc[cpu::kColumnBlock] = {};
    float db_acc[cpu::kColumnBlock] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * C + c0;
      const float* dyr = dy + r * C + c0;
      const float mu = mean[r];
      const float rs = rstd[r];
      for (std::int64_t c = 0; c < width; ++c) {
        dw_acc[c] += dyr[c] * (xr[c] - mu) * rs;
        db_acc[c] += dyr[c];
      }
    }
    for (std::int64_t c = 0; c < width; ++c) dweight[c0 + c] += dw_acc[c];
    if (dbias != nullptr) {
      for (std::int64_t c = 0; c < width; ++c) dbias[c0 + c] += db_acc[c];
    }
  });
}

}  // namespace meshtrain::kernels
