// src/meshtrain/kernels/cpu/gelu.cpp
//
// GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016, §2; PyTorch
// GELU(approximate="tanh")): gelu(x) = 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³).
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // √(2/π)
constexpr float kCubic = 0.044715f;

}  // namespace

void gelu_forward(const float* x, float* y, std::int64_t n) {
  MT_CHECK(n >= 0, "gelu_forward: n={}", n);
  // tanh is costly enough (≈10–20 ns scalar) that a lower grain would pay, but GPT's MLP
  // activations are far above it anyway.
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain / 4)
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    y[i] = 0.5f * v * (1.0f + std::tanh(u));
  }
}

void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  MT_CHECK(n >= 0, "gelu_backward: n={}", n);
  // d/dx [0.5·x·(1 + tanh u)] = 0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·du/dx,
  // du/dx = √(2/π)·(1 + 3·0.044715·x²).
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain / 4)
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    const float t = std::tanh(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

}  // namespace meshtrain::kernels
