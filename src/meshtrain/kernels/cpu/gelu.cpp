// src/meshtrain/kernels/cpu/gelu.cpp
//
// GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016, §2; PyTorch
// GELU(approximate="tanh")): gelu(x) = 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³).
// Computed through the identity ½(1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)): one vectorisable
// exp instead of a scalar tanhf call, and no cancellation in 1 + tanh u for negative u.
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

}  // namespace

void gelu_forward(const float* x, float* y, std::int64_t n) {
  MT_CHECK(n >= 0, "gelu_forward: n={}", n);
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    y[i] = v / (1.0f + cpu::exp_approx(-2.0f * u));
  }
}

void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  MT_CHECK(n >= 0, "gelu_backward: n={}", n);
  // With s = σ(2u) = ½(1 + tanh u): d/dx [x·s] = s + x·2s(1 − s)·du/dx, since
  // dσ(z)/dz = σ(1 − σ) and ½(1 − tanh² u) = 2s(1 − s); du/dx = √(2/π)·(1 + 3·0.044715·x²).
  // dx may alias dy: each element is read before it is written.
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    const float s = 1.0f / (1.0f + cpu::exp_approx(-2.0f * u));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
    dx[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
}

}  // namespace meshtrain::kernels
