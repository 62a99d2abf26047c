// src/meshtrain/kernels/cpu/layernorm.cpp
//
// LayerNorm over the last dim (Ba et al. 2016, "Layer Normalization", eq. 4; PyTorch
// nn.LayerNorm: biased variance, eps inside the square root).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/vec_transpose.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

namespace {

// This file compiles with -ffp-contract=off (src/meshtrain/CMakeLists.txt): a product is
// rounded before it is added unless the code says std::fma, so every formula below means one
// thing whatever the vectoriser does. The FMAs are where GCC contracted the earlier one-row
// kernels' vectorised loops, so results are bitwise those kernels' for C % 4 == 0 (every
// model width; their scalar tails, C % 4 ≠ 0, were contracted and differ in the last bit).

// Rows normalised together: one per vector lane. Each row's sums are sequential adds in
// column order, a chain bound by the add latency. A whole group runs its kRowGroup chains in
// the lanes of one vector, reading its rows through kLanes × kLanes blocks transposed in
// registers (vec_transpose.h): each lane does exactly the float operations, in exactly the
// order, of its row's scalar chain, so a row's result is that of the row alone. The scalar
// loops serve a last partial group (and the columns past the whole blocks), with the same
// order. About twice as fast as scalar chains of 8 interleaved rows (eltwise_bench; the
// figures: docs/performance.md, "Figures behind comments in the source").
using cpu::kLanes;
using cpu::load_transposed;
using cpu::load_vec;
using cpu::store_vec;
constexpr std::int64_t kRowGroup = kLanes;
using Lanes = cpu::FloatVec<kLanes>;

// out[l] = t[l·C] + t[l·C + 1] + … + t[l·C + C − 1], added in that order, for rows l < n.
// With `mu`, the summands are (t − mu[l])² instead: d = t − mu[l] rounded, then d·d rounded.
void row_sums(const float* t, std::int64_t n, std::int64_t C, const float* mu, float* out) {
  float s[kRowGroup] = {};
  std::int64_t c = 0;
  if (n == kRowGroup) {
    const Lanes m = mu != nullptr ? load_vec<kLanes>(mu) : Lanes{};
    Lanes acc{};
    for (; c + kLanes <= C; c += kLanes) {
      Lanes cols[kLanes];
      load_transposed(t, C, c, cols);
      for (std::int64_t j = 0; j < kLanes; ++j) {
        if (mu != nullptr) {
          const Lanes d = cols[j] - m;
          acc += d * d;
        } else {
          acc += cols[j];
        }
      }
    }
    store_vec<kLanes>(s, acc);
  }
  for (; c < C; ++c) {
    for (std::int64_t l = 0; l < n; ++l) {
      if (mu != nullptr) {
        const float d = t[l * C + c] - mu[l];
        s[l] += d * d;
      } else {
        s[l] += t[l * C + c];
      }
    }
  }
  std::copy_n(s, n, out);
}

// Rows [0, n) of a group, n ≤ kRowGroup, rows C apart: shared by the plain and the
// residual-fused kernels, so the two are the same float operations in the same order
// (bitwise equal, fused_kernels_test).
void layernorm_rows(const float* x, const float* weight, const float* bias, float* y, float* mean,
                    float* rstd, std::int64_t n, std::int64_t C, float inv_c, float eps) {
  float sum[kRowGroup];
  row_sums(x, n, C, nullptr, sum);
  float mu[kRowGroup] = {};
  for (std::int64_t l = 0; l < n; ++l) mu[l] = sum[l] * inv_c;
  // Two passes (mean, then squared deviations) instead of E[x²] − E[x]²: the one-pass
  // form cancels catastrophically when |mean| ≫ std, as for residual streams late in training.
  float sq[kRowGroup];
  row_sums(x, n, C, mu, sq);
  for (std::int64_t l = 0; l < n; ++l) {
    const float rs = 1.0f / std::sqrt(std::fma(sq[l], inv_c, eps));
    mean[l] = mu[l];
    rstd[l] = rs;
    const float* xr = x + l * C;
    float* yr = y + l * C;
    const float m = mu[l];
    if (bias != nullptr) {
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) yr[c] = std::fma((xr[c] - m) * rs, weight[c], bias[c]);
    } else {
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * weight[c];
    }
  }
}

// Σ_c g and Σ_c g·x̂ of rows [0, n) of a group, g = dy·weight and x̂ = (x − μ)·rstd, each added
// in column order (the two chains of layernorm_backward_rows).
void backward_row_sums(const float* x, const float* weight, const float* mean, const float* rstd,
                       const float* dy, std::int64_t n, std::int64_t C, float* g_sum,
                       float* gx_sum) {
  std::fill_n(g_sum, n, 0.0f);
  std::fill_n(gx_sum, n, 0.0f);
  std::int64_t c = 0;
  if (n == kRowGroup) {
    const Lanes mu = load_vec<kLanes>(mean), rs = load_vec<kLanes>(rstd);
    Lanes gs{}, gxs{};
    for (; c + kLanes <= C; c += kLanes) {
      Lanes dys[kLanes], xs[kLanes];
      load_transposed(dy, C, c, dys);
      load_transposed(x, C, c, xs);
      for (std::int64_t j = 0; j < kLanes; ++j) {
        const Lanes g = dys[j] * weight[c + j];
        gs += g;
        gxs += g * (xs[j] - mu) * rs;
      }
    }
    store_vec<kLanes>(g_sum, gs);
    store_vec<kLanes>(gx_sum, gxs);
  }
  for (; c < C; ++c) {
    for (std::int64_t l = 0; l < n; ++l) {
      const float g = dy[l * C + c] * weight[c];
      g_sum[l] += g;
      gx_sum[l] += g * (x[l * C + c] - mean[l]) * rstd[l];
    }
  }
}

// dx of rows [0, n) of a group (rows C apart). With x̂ = (x − μ)·rstd and g = dy ∘ weight,
// differentiating through μ and rstd gives
//   dx = rstd · (g − mean(g) − x̂ · mean(g ∘ x̂))
// (the form llm.c's layernorm_backward uses; each row is independent).
void layernorm_backward_rows(const float* x, const float* weight, const float* mean,
                             const float* rstd, const float* dy, const float* dresidual, float* dx,
                             std::int64_t n, std::int64_t C, float inv_c) {
  float g_sum[kRowGroup];
  float gx_sum[kRowGroup];
  backward_row_sums(x, weight, mean, rstd, dy, n, C, g_sum, gx_sum);
  for (std::int64_t l = 0; l < n; ++l) {
    const float* xr = x + l * C;
    const float* dyr = dy + l * C;
    float* dxr = dx + l * C;
    const float mu = mean[l];
    const float rs = rstd[l];
    const float g_mean = g_sum[l] * inv_c;
    const float gx_mean = gx_sum[l] * inv_c;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mu) * rs;
      // rs · (dy·w − g_mean − x̂·gx_mean), the two subtractions fused.
      dxr[c] = rs * std::fma(-xhat, gx_mean, std::fma(dyr[c], weight[c], -g_mean));
    }
    // The residual's gradient is added in its own loop over the row (still in L1), after the
    // row is stored: a separate rounding, as add_inplace after the norm had it.
    if (dresidual != nullptr) {
      const float* dr = dresidual + l * C;
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) dxr[c] += dr[c];
    }
  }
}

std::int64_t row_groups(std::int64_t rows) { return (rows + kRowGroup - 1) / kRowGroup; }

}  // namespace

void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                       float* mean, float* rstd, std::int64_t rows, std::int64_t C, float eps) {
  MT_CHECK(rows >= 0 && C > 0, "layernorm_forward: bad dims rows={} C={}", rows, C);
  const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t g = 0; g < row_groups(rows); ++g) {
    const std::int64_t r = g * kRowGroup;
    layernorm_rows(x + r * C, weight, bias, y + r * C, mean + r, rstd + r,
                   std::min(kRowGroup, rows - r), C, inv_c, eps);
  }
}

void residual_layernorm_forward(const float* a, const float* b, float* h, const float* weight,
                                const float* bias, float* y, float* mean, float* rstd,
                                std::int64_t rows, std::int64_t C, float eps) {
  MT_CHECK(rows >= 0 && C > 0, "residual_layernorm_forward: bad dims rows={} C={}", rows, C);
  const float inv_c = 1.0f / static_cast<float>(C);
  // A group's rows of h are written and normalised while they are in L1: one pass over memory
  // instead of add_inplace's read-modify-write followed by the norm's reads.
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t g = 0; g < row_groups(rows); ++g) {
    const std::int64_t r = g * kRowGroup;
    const std::int64_t n = std::min(kRowGroup, rows - r);
    float* hr = h + r * C;
    const float* ar = a + r * C;
    const float* br = b + r * C;
#pragma omp simd
    for (std::int64_t i = 0; i < n * C; ++i) hr[i] = ar[i] + br[i];
    layernorm_rows(hr, weight, bias, y + r * C, mean + r, rstd + r, n, C, inv_c, eps);
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
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t g = 0; g < row_groups(rows); ++g) {
    const std::int64_t r = g * kRowGroup;
    layernorm_backward_rows(x + r * C, weight, mean + r, rstd + r, dy + r * C,
                            dresidual != nullptr ? dresidual + r * C : nullptr, dx + r * C,
                            std::min(kRowGroup, rows - r), C, inv_c);
  }

  // dweight += Σ_r dy ∘ x̂ and dbias += Σ_r dy are sums over rows: threads own column ranges
  // so nothing races and the summation order does not depend on the thread count.
  cpu::for_each_column_range(rows, C, [&](std::int64_t c0, std::int64_t width) {
    float* dw_acc = cpu::thread_scratch(2 * static_cast<std::size_t>(width));
    float* db_acc = dw_acc + width;
    std::fill_n(dw_acc, 2 * width, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * C + c0;
      const float* dyr = dy + r * C + c0;
      const float mu = mean[r];
      const float rs = rstd[r];
#pragma omp simd
      for (std::int64_t c = 0; c < width; ++c) {
        dw_acc[c] = std::fma(dyr[c] * (xr[c] - mu), rs, dw_acc[c]);
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
