// src/meshtrain/kernels/cpu/gelu.cpp
//
// GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016, §2; PyTorch
// GELU(approximate="tanh")): gelu(x) = 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³).
// Computed through the identity ½(1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)): one exp instead of
// a scalar tanhf call, and no cancellation in 1 + tanh u for negative u.
//
// The loops run on native vectors (vec.h's for_each_vector, the tail of a row or array in one
// partial vector), so every element gets the same operations wherever it lies, and the plain
// and the bias-fused kernels agree bitwise. The work is compute-bound (≈ 25 vector
// operations per vector against two or three memory streams), hence cpu::exp_approx_vec in
// place of the loop vectoriser's rendering of the scalar exp_approx, which branched three
// ways on the clamp and divided twice per vector.
#include <algorithm>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/vec.h"
#include "meshtrain/kernels/cpu/vector_math.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

using cpu::for_each_vector;
using cpu::kLanes;
using cpu::load_lanes;
using cpu::parallel_vectors;
using cpu::store_lanes;
using V = cpu::FloatVec<kLanes>;

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // √(2/π)
constexpr float kCubic = 0.044715f;

// 1 + e^(−2u) = 1/σ(2u) for the GELU's u(v).
inline V one_plus_exp_minus_2u(V v) {
  const V u = kSqrt2OverPi * (v + kCubic * v * v * v);
  return 1.0f + cpu::exp_approx_vec(-2.0f * u);
}

inline V gelu_of(V v) { return v / one_plus_exp_minus_2u(v); }

// With s = σ(2u) = ½(1 + tanh u): d/dx [x·s] = s + x·2s(1 − s)·du/dx, since
// dσ(z)/dz = σ(1 − σ) and ½(1 − tanh² u) = 2s(1 − s); du/dx = √(2/π)·(1 + 3·0.044715·x²).
inline V dgelu_of(V v, V dy) {
  const V s = 1.0f / one_plus_exp_minus_2u(v);
  const V du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
  return dy * (s + 2.0f * v * s * (1.0f - s) * du);
}

}  // namespace

void gelu_forward(const float* x, float* y, std::int64_t n) {
  MT_CHECK(n >= 0, "gelu_forward: n={}", n);
  parallel_vectors(n, [=](std::int64_t i, std::int64_t c) {
    store_lanes(y + i, gelu_of(load_lanes(x + i, c)), c);
  });
}

void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  MT_CHECK(n >= 0, "gelu_backward: n={}", n);
  // dx may alias dy: each vector is read before it is written.
  parallel_vectors(n, [=](std::int64_t i, std::int64_t c) {
    store_lanes(dx + i, dgelu_of(load_lanes(x + i, c), load_lanes(dy + i, c)), c);
  });
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
    for_each_vector(F, [=](std::int64_t j, std::int64_t c) {
      V p = load_lanes(pr + j, c);
      if (bias != nullptr) {
        p += load_lanes(bias + j, c);
        store_lanes(pr + j, p, c);
      }
      store_lanes(yr + j, gelu_of(p), c);
    });
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
      for_each_vector(width, [=](std::int64_t j, std::int64_t c) {
        const V d = dgelu_of(load_lanes(pr + j, c), load_lanes(dyr + j, c));
        store_lanes(dxr + j, d, c);
        store_lanes(acc + j, load_lanes(acc + j, c) + d, c);
      });
    }
    for (std::int64_t j = 0; j < width; ++j) dbias[j0 + j] += acc[j];
  });
}

}  // namespace meshtrain::kernels
