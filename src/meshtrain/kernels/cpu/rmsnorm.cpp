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

void rmsnorm_forward(const float* x, const float* weight, float* y, float* rstd, std::int64_t rows,
                     std::int64_t C, float eps) {
  MT_CHECK(rows >= 0 && C > 0, "rmsnorm_forward: bad dims rows={} C={}", rows, C);
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    double sq = 0.0;
    for (std::int64_t c = 0; c < C; ++c) sq += static_cast<double>(xr[c]) * xr[c];
    const float rs =
        static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(C) + static_cast<double>(eps)));
    rstd[r] = rs;
    for (std::int64_t c = 0; c < C; ++c) yr[c] = weight[c] * (xr[c] * rs);
  }
}

void rmsnorm_backward(const float* x, const float* weight, const float* rstd, const float* dy,
                      float* dx, float* dweight, std::int64_t rows, std::int64_t C) {
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
  }

  // dweight += Σ_r dy ∘ x·rstd is a sum over rows: threads own column blocks so nothing races
  // and the summation order does not depend on the thread count (as in layernorm_backward).
  cpu::for_each_column_block(rows, C, [&](std::int64_t c0, std::int64_t width) {
    float dw_acc[cpu::kColumnBlock] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * C + c0;
      const float* dyr = dy + r * C + c0;
      const float rs = rstd[r];
      for (std::int64_t c = 0; c < width; ++c) dw_acc[c] += dyr[c] * (xr[c] * rs);
    }
    for (std::int64_t c = 0; c < width; ++c) dweight[c0 + c] += dw_acc[c];
  });
}

}  // namespace meshtrain::kernels
