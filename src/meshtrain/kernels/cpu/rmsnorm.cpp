// src/meshtrain/kernels/cpu/rmsnorm.cpp
//
// RMSNorm over the last dim (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization",
// eq. 4; Hugging Face LlamaRMSNorm): y = x·rstd·w, rstd = 1/√(mean(x²) + eps), no centring
// and no bias. Hugging Face rounds as weight · (x · rstd); so does this kernel.
// mean(x²) and the backward's row dot product are accumulated in double: one conversion per
// element in a loop that is bound by memory anyway, and rstd then carries only its final f32
// rounding, independent of C.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

namespace {

// One row of the forward, shared by the plain and the residual-fused kernels (bitwise equal).
inline void rmsnorm_row(const float* xr, const float* weight, float* yr, float* rstd,
                        std::int64_t C, float eps) {
  double sq = 0.0;
  for (std::int64_t c = 0; c < C; ++c) sq += static_cast<double>(xr[c]) * xr[c];
  const float rs =
      static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(C) + static_cast<double>(eps)));
  *rstd = rs;
  for (std::int64_t c = 0; c < C; ++c) yr[c] = weight[c] * (xr[c] * rs);
}

}  // namespace

void rmsnorm_forward(const float* x, const float* weight, float* y, float* rstd, std::int64_t rows,
                     std::int64_t C, float eps) {
  MT_CHECK(rows >= 0 && C > 0, "rmsnorm_forward: bad dims rows={} C={}", rows, C);
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    rmsnorm_row(x + r * C, weight, y + r * C, rstd + r, C, eps);
  }
}

void residual_rmsnorm_forward(const float* a, const float* b, float* h, const float* weight,
                              float* y, float* rstd, std::int64_t rows, std::int64_t C, float eps) {
  MT_CHECK(rows >= 0 && C > 0, "residual_rmsnorm_forward: bad dims rows={} C={}", rows, C);
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* hr = h + r * C;
    const float* ar = a + r * C;
    const float* br = b + r * C;
    for (std::int64_t c = 0; c < C; ++c) hr[c] = ar[c] + br[c];
    rmsnorm_row(hr, weight, y + r * C, rstd + r, C, eps);
  }
}

void rmsnorm_backward(const float* x, const float* weight, const float* rstd, const float* dy,
                      float* dx, float* dweight, std::int64_t rows, std::int64_t C) {
  rmsnorm_backward(x, weight, rstd, dy, nullptr, dx, dweight, rows, C);
}

void rmsnorm_backward(const float* x, const float* weight, const float* rstd, const float* dy,
                      const float* dresidual, float* dx, float* dweight, std::int64_t rows,
                      std::int64_t C) {
  MT_CHECK(rows >= 0 && C > 0, "rmsnorm_backward: bad dims rows={} C={}", rows, C);
  // With g = dy ∘ w and y = w ∘ x·rstd, rstd = (mean(x²) + eps)^(−½), so
  // ∂rstd/∂x_c = −rstd³·x_c / C and
  //   dx = rstd · (g − x · rstd² · mean(g ∘ x))
  // (LayerNorm's formula without the centring terms; each row is independent).
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float rs = rstd[r];
    double gx_sum = 0.0;
    for (std::int64_t c = 0; c < C; ++c) {
      gx_sum += static_cast<double>(dyr[c] * weight[c]) * xr[c];
    }
    const double rs_d = rs;
    const float k = static_cast<float>(rs_d * rs_d * gx_sum / static_cast<double>(C));
    for (std::int64_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * weight[c] - xr[c] * k);
    // Added after the row is stored, a separate rounding as add_inplace had it (see layernorm).
    if (dresidual != nullptr) {
      const float* dr = dresidual + r * C;
      for (std::int64_t c = 0; c < C; ++c) dxr[c] += dr[c];
    }
  }

  // dweight += Σ_r dy ∘ x·rstd is a sum over rows: threads own column ranges so nothing races
  // and the summation order does not depend on the thread count (as in layernorm_backward).
  cpu::for_each_column_range(rows, C, [&](std::int64_t c0, std::int64_t width) {
    float* dw_acc = cpu::thread_scratch(static_cast<std::size_t>(width));
    std::fill_n(dw_acc, width, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * C + c0;
      const float* dyr = dy + r * C + c0;
      const float rs = rstd[r];
#pragma omp simd
      for (std::int64_t c = 0; c < width; ++c) dw_acc[c] += dyr[c] * (xr[c] * rs);
    }
    for (std::int64_t c = 0; c < width; ++c) dweight[c0 + c] += dw_acc[c];
  });
}

}  // namespace meshtrain::kernels
