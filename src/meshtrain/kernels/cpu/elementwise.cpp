// src/meshtrain/kernels/cpu/elementwise.cpp
//
// Element-wise helpers of the residual stream, gradient scaling and zeroing, the global grad
// norm and the non-finite check of gradients before their reduction.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/vec.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

// Elements per partial sum of sum_squares. The partition depends only on n, never on the
// thread count, so the grad norm (and hence clipping) is bitwise the same with 1 or 2 threads.
constexpr std::int64_t kSumBlock = 8192;
// Independent double accumulators inside a block: element i of a block's whole groups of 32
// goes to lane i mod 32, the tail to lane 0; the lanes are added in order at the end. A fixed
// order without -ffast-math. 32 lanes are 32 / kChain chains of one native double vector
// each (4 zmm with AVX-512, 8 ymm with AVX2): with one chain per 8 lanes the FMA latency, not
// memory, bounded the pass. The chains are exactly one register wide: a GCC vector wider than
// the machine's (8 doubles on AVX2) is kept in memory and moved through general registers
// every iteration (eltwise_bench `sum_squares`; the figures: docs/performance.md, "Figures
// behind comments in the source"). Which lane an element goes to does not depend on kChain, so
// neither does the result. Each lane is one multiply-add per element: the body's v·v + acc is
// contracted into an FMA (GCC's default -ffp-contract=fast, an FMA target as -march=native
// gives on every x86 CPU since Haswell); the tail spells std::fma.
constexpr std::int64_t kSumLanes = 32;
constexpr std::int64_t kChain = cpu::kLanes / 2;  // doubles per native vector register
static_assert(kSumLanes % kChain == 0);
using DoubleVec [[gnu::vector_size(kChain * sizeof(double))]] = double;

/// x[0, kChain) as doubles, one vcvtps2pd from memory. GCC 12 compiles the portable forms
/// worse on AVX2: __builtin_convertvector of 4 floats to 4 doubles as two 2-wide converts and
/// an insert, a lane-by-lane fill as scalar converts (seen in the disassembly of this loop).
inline DoubleVec widen(const float* x) {
#if defined(__AVX512F__)
  static_assert(kChain == 8);
  // The zero-masking form with every lane set: the plain intrinsic passes GCC 12's
  // _mm512_undefined_pd() through, which -Wmaybe-uninitialized reports (as in vector_math.h).
  constexpr __mmask8 kAll = 0xFF;
  return reinterpret_cast<DoubleVec>(_mm512_maskz_cvtps_pd(kAll, _mm256_loadu_ps(x)));
#elif defined(__AVX__)
  static_assert(kChain == 4);
  return reinterpret_cast<DoubleVec>(_mm256_cvtps_pd(_mm_loadu_ps(x)));
#else
  return __builtin_convertvector(cpu::load_vec<kChain>(x), DoubleVec);
#endif
}

double block_sum_squares(const float* x, std::int64_t n) {
  DoubleVec acc[kSumLanes / kChain] = {};
  std::int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (std::int64_t c = 0; c < kSumLanes / kChain; ++c) {
      const DoubleVec v = widen(x + i + c * kChain);
      acc[c] += v * v;  // contracted: one multiply-add per element
    }
  }
  double lane0 = acc[0][0];
  for (; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    lane0 = std::fma(v, v, lane0);
  }
  acc[0][0] = lane0;
  double total = 0.0;
  for (std::int64_t l = 0; l < kSumLanes; ++l) total += acc[l / kChain][l % kChain];
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

void zero_all(std::span<const std::span<std::byte>> spans) {
  std::int64_t total = 0;
  for (const std::span<std::byte>& s : spans) total += static_cast<std::int64_t>(s.size());
  // Cuts at multiples of 64 bytes of the concatenated order, not of addresses: where a span
  // does not start on a line, two threads may write one cache line (false sharing at one line
  // per cut, no race).
  constexpr std::int64_t kLine = 64;
  const auto count = static_cast<std::int64_t>(spans.size());
#pragma omp parallel if (total >= 4 * cpu::kParallelGrain)
  cpu::for_thread_share(
      count, [&](std::int64_t k) { return static_cast<std::int64_t>(spans[k].size()); }, total,
      kLine,
      [&](std::int64_t k, std::int64_t from, std::int64_t to) {
        std::memset(spans[k].data() + from, 0, static_cast<std::size_t>(to - from));
      });
}

}  // namespace meshtrain::kernels
