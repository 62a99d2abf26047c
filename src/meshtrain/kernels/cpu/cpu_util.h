// src/meshtrain/kernels/cpu/cpu_util.h
//
// Private helpers of the CPU kernels (not part of the kernels.h API): when an OpenMP region
// pays for itself, and per-thread scratch that is allocated once and then reused.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshtrain::kernels::cpu {

/// Below this many elements of cheap element-wise work, the fork/join of an OpenMP region
/// (a few µs with 2 threads) costs more than the loop itself (≈0.1 ns per element when
/// vectorised), so loops stay on the calling thread.
inline constexpr std::int64_t kParallelGrain = std::int64_t{1} << 15;

/// Column ranges of for_each_column_range start at multiples of this many floats (one 64-byte
/// cache line), so two threads never write the same line of an output row.
inline constexpr std::int64_t kColumnAlign = 16;

/// Runs body(c0, width) on one contiguous range [c0, c0 + width) of [0, C) per thread, the
/// ranges covering [0, C) once, when rows·C is worth a parallel region (else body(0, C) on the
/// calling thread). For reductions over rows into a per-column result (bias, norm-weight and
/// embedding gradients): each column is owned by one thread, so nothing races and every entry
/// sums its rows in order 0, 1, … whatever the thread count (bitwise reproducible). One range
/// per thread rather than many narrow blocks: each row visit then streams width·4 bytes
/// (kilobytes) of every array, where 64-column blocks touched 256 B per row and array, which
/// the hardware prefetcher follows poorly at row strides of kilobytes (perf: the GELU
/// backward at 5 GB/s in 64-column blocks).
template <typename Body>
void for_each_column_range(std::int64_t rows, std::int64_t C, Body&& body) {
  if (rows * C < kParallelGrain || omp_get_max_threads() == 1) {
    if (C > 0) body(std::int64_t{0}, C);
    return;
  }
  const std::int64_t lines = (C + kColumnAlign - 1) / kColumnAlign;
#pragma omp parallel
  {
    const std::int64_t threads = omp_get_num_threads();
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t c0 = std::min(C, lines * t / threads * kColumnAlign);
    const std::int64_t c1 = std::min(C, lines * (t + 1) / threads * kColumnAlign);
    if (c1 > c0) body(c0, c1 - c0);
  }
}

/// Inside a parallel region: this thread's share of `count` pieces laid end to end (piece k
/// has size_of(k) units, `total` in all). The threads take one contiguous range each of the
/// concatenated units, cut at multiples of `cut` units of that order, and body(k, from, to) is
/// called for every piece the range overlaps, with [from, to) the overlap in the piece's own
/// units. The ranges cover every unit once, whatever the thread count, so many small pieces
/// cost one region instead of a serial call each (adamw_step_all's tensors, zero_all's spans).
template <typename SizeOf, typename Body>
void for_thread_share(std::int64_t count, SizeOf&& size_of, std::int64_t total, std::int64_t cut,
                      Body&& body) {
  const std::int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
  const std::int64_t units = (total + cut - 1) / cut;
  const std::int64_t lo = std::min(total, units * thread / threads * cut);
  const std::int64_t hi = std::min(total, units * (thread + 1) / threads * cut);
  std::int64_t begin = 0;  // piece k's first unit in the concatenated order
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t end = begin + size_of(k);
    if (end > lo && begin < hi) body(k, std::max(lo, begin) - begin, std::min(hi, end) - begin);
    begin = end;
  }
}

/// Per-thread scratch of at least n floats. The vector only grows, so after the first step
/// a training loop allocates nothing here (DESIGN machine notes: fresh pages cost ≈12 µs).
/// The pointer stays valid until the same thread asks for more.
inline float* thread_scratch(std::size_t n) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}

}  // namespace meshtrain::kernels::cpu
