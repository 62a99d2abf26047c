// src/meshtrain/kernels/cpu/gelu.cpp
//
// GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016, §2; PyTorch
// GELU(approximate="tanh")): gelu(x) = 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³).
// Computed through the identity ½(1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)): one vectorisable
// exp instead of a scalar tanhf call, and no cancellation in 1 + tanh u for negative u.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/vector_math.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // √(2/π)
constexpr float kCubic = 0.044715f;

// The element formulas, shared by the plain and the bias-fused kernels (bitwise equal).
inline float gelu_of(float v) {
  const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
  return v / (1.0f + cpu::exp_approx(-2.0f * u));
}

inline float dgelu_of(float v, float dy) {
  const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
  const float s = 1.0f / (1.0f + cpu::exp_approx(-2.0f * u));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
  return dy * (s + 2.0f * v * s * (1.0f - s) * du);
}

}  // namespace

void gelu_forward(const float* x, float* y, std::int64_t n) {
  MT_CHECK(n >= 0, "gelu_forward: n={}", n);
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) y[i] = gelu_of(x[i]);
}

void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  MT_CHECK(n >= 0, "gelu_backward: n={}", n);
  // With s = σ(2u) = ½(1 + tanh u): d/dx [x·s] = s + x·2s(1 − s)·du/dx, since
  // dσ(z)/dz = σ(1 − σ) and ½(1 − tanh² u) = 2s(1 − s); du/dx = √(2/π)·(1 + 3·0.044715·x²).
  // dx may alias dy: each element is read before it is written.
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) dx[i] = dgelu_of(x[i], dy[i]);
}

void bias_gelu_forward(float* pre, const float* bias, float* y, std::int64_t rows, std::int64_t F) {
  MT_CHECK(rows >= 0 && F >= 0, "bias_gelu_forward: bad dims rows={} F={}", rows, F);
  // One pass: pre += bias (the kept pre-activation, as the linear's bias add wrote it) and
  // y = gelu(pre) in the same loop, so each element is loaded once; p is the rounded sum
  // that the store keeps, as when the two were separate loops.
#pragma omp parallel for schedule(static) if (rows * F >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* pr = pre + r * F;
    float* yr = y + r * F;
    if (bias != nullptr) {
#pragma omp simd
      for (std::int64_t j = 0; j < F; ++j) {
        const float p = pr[j] + bias[j];
        pr[j] = p;
        yr[j] = gelu_of(p);
      }
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < F; ++j) yr[j] = gelu_of(pr[j]);
    }
  }
}

void gelu_bias_backward(const float* pre, const float* dy, float* dx, float* dbias,
                        std::int64_t rows, std::int64_t F) {
  MT_CHECK(rows >= 0 && F >= 0, "gelu_bias_backward: bad dims rows={} F={}", rows, F);
  if (dbias == nullptr) {
    gelu_backward(pre, dy, dx, rows * F);
    return;
  }
  // Each thread owns one contiguous column range (cpu::for_each_column_range), so every dbias
  // entry sums its rows in row order whatever the thread count, and each row visit streams
  // the range's kilobytes of pre, dy and dx. The range's partial sums stay in L1 and are
  // added in the same loop that writes dx: one pass over dy instead of gelu_backward's and
  // then bias_backward's. d is the rounded value stored to dx, so the sums are bias_backward's.
  cpu::for_each_column_range(rows, F, [&](std::int64_t j0, std::int64_t width) {
    float* acc = cpu::thread_scratch(static_cast<std::size_t>(width));
    std::fill_n(acc, width, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* pr = pre + r * F + j0;
      const float* dyr = dy + r * F + j0;
      float* dxr = dx + r * F + j0;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) {
        const float d = dgelu_of(pr[j], dyr[j]);
        dxr[j] = d;
        acc[j] += d;
      }
    }
    for (std::int64_t j = 0; j < width; ++j) dbias[j0 + j] += acc[j];
  });
}

}  // namespace meshtrain::kernels
