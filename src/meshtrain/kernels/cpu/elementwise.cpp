// src/meshtrain/kernels/cpu/elementwise.cpp
//
// Element-wise helpers of the residual stream, gradient scaling, the global grad norm and the
// non-finite check of gradients before their reduction.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

// Elements per partial sum of sum_squares. The partition depends only on n, never on the
// thread count, so the grad norm (and hence clipping) is bitwise the same with 1 or 2 threads.
constexpr std::int64_t kSumBlock = 8192;
// Independent accumulators inside a block: breaks the add latency chain and lets the compiler
// vectorise across lanes without -ffast-math, still in a fixed order.
constexpr std::int64_t kLanes = 8;

double block_sum_squares(const float* x, std::int64_t n) {
  double acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::int64_t l = 0; l < kLanes; ++l) {
      const double v = static_cast<double>(x[i + l]);
      acc[l] += v * v;
    }
  }
  for (; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    acc[0] += v * v;
  }
  double total = 0.0;
  for (std::int64_t l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

}  // namespace

void add(const float* a, const float* b, float* out, std::int64_t n) {
  MT_CHECK(n >= 0, "add: n={}", n);
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* y, const float* x, std::int64_t n) {
  MT_CHECK(n >= 0, "add_inplace: n={}", n);
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float alpha, std::int64_t n) {
  MT_CHECK(n >= 0, "scale_inplace: n={}", n);
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

bool all_finite(const float* x, std::int64_t n) noexcept {
  // A float is NaN or ±inf exactly when its 8 exponent bits are all ones.
  constexpr std::uint32_t kExponent = 0x7f800000u;
  std::uint32_t worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    worst = std::max(worst, bits & kExponent);
  }
  return worst != kExponent;
}

double sum_squares(const float* x, std::int64_t n) {
  MT_CHECK(n >= 0, "sum_squares: n={}", n);
  const std::int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  if (blocks <= 1) return block_sum_squares(x, n);
  thread_local std::vector<double> partials;  // grows once, then reused every step
  if (partials.size() < static_cast<std::size_t>(blocks)) partials.resize(blocks);
  double* part = partials.data();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t i0 = blk * kSumBlock;
    part[blk] = block_sum_squares(x + i0, std::min(kSumBlock, n - i0));
  }
  double total = 0.0;
  for (std::int64_t blk = 0; blk < blocks; ++blk) total += part[blk];
  return total;
}

}  // namespace meshtrain::kernels
