// src/meshtrain/kernels/cpu/elementwise.cpp
//
// Element-wise helpers of the residual stream, gradient scaling and the global grad norm.
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

// The kLanes accumulators as one vector (GCC/Clang vector extensions): acc[l] += x[i + l]² in
// double, i in order, with one multiply-add per lane, as the scalar form contracted it, in
// one vector FMA per kLanes elements instead of kLanes scalar ones.
using Lanes = double __attribute__((vector_size(kLanes * sizeof(double))));
using LanesF = float __attribute__((vector_size(kLanes * sizeof(float))));

double block_sum_squares(const float* x, std::int64_t n) {
  Lanes acc = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    LanesF f;
    std::memcpy(&f, x + i, sizeof f);  // an unaligned vector load
    const Lanes v = __builtin_convertvector(f, Lanes);
    acc += v * v;
  }
  double lane[kLanes];
  std::memcpy(lane, &acc, sizeof lane);
  for (; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    lane[0] += v * v;
  }
  double total = 0.0;
  for (std::int64_t l = 0; l < kLanes; ++l) total += lane[l];
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
