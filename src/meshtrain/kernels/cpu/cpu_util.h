// src/meshtrain/kernels/cpu/cpu_util.h
//
// Private helpers of the CPU kernels (not part of the kernels.h API): when an OpenMP region
// pays for itself, and per-thread scratch that is allocated once and then reused.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshtrain::kernels::cpu {

/// Below this many elements of cheap element-wise work, the fork/join of an OpenMP region
/// (a few µs with 2 threads) costs more than the loop itself (≈0.1 ns per element when
/// vectorised), so loops stay on the calling thread.
inline constexpr std::int64_t kParallelGrain = std::int64_t{1} << 15;

/// Columns handled by one task in column-blocked reductions (bias/LayerNorm/embedding
/// gradients): 64 floats = 4 cache lines per row, enough to vectorise, small enough that a
/// 128-wide model still gives 2 threads work.
inline constexpr std::int64_t kColumnBlock = 64;

/// Runs body(c0, width) for every block [c0, c0 + width) of kColumnBlock columns of [0, C), the
/// blocks split over threads when rows·C is worth a parallel region. For reductions over rows
/// into a per-column result (bias, norm-weight and embedding gradients): each column is owned
/// by one task, so nothing races and every entry sums its rows in order 0, 1, … whatever the
/// thread count (bitwise reproducible).
template <typename Body>
void for_each_column_block(std::int64_t rows, std::int64_t C, Body&& body) {
  const std::int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * C >= kParallelGrain)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t c0 = blk * kColumnBlock;
    body(c0, std::min(kColumnBlock, C - c0));
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
