// src/meshtrain/kernels/cpu/embedding.cpp
//
// Embedding lookup (a row gather) and its backward (a scatter-add into the table).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

void embedding_forward(const std::int32_t* ids, const float* table, float* out, std::int64_t rows,
                       std::int64_t C) {
  MT_CHECK(rows >= 0 && C >= 0, "embedding_forward: bad dims rows={} C={}", rows, C);
  // The API does not pass the table's row count, so only the lower bound is checkable here;
  // the data loader validates ids against the vocabulary.
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    MT_CHECK(ids[r] >= 0, "embedding_forward: id {} of row {} is negative", ids[r], r);
    std::memcpy(out + r * C, table + static_cast<std::int64_t>(ids[r]) * C,
                static_cast<std::size_t>(C) * sizeof(float));
  }
}

void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable,
                        std::int64_t rows, std::int64_t C) {
  MT_CHECK(rows >= 0 && C >= 0, "embedding_backward: bad dims rows={} C={}", rows, C);
  // Repeated ids add into the same table row, so rows cannot be split between threads.
  // Threads own column blocks instead: no races, no atomics, and each table entry receives
  // its rows in order r = 0, 1, … whatever the thread count (bitwise reproducible).
  const std::int64_t blocks = (C + cpu::kColumnBlock - 1) / cpu::kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t c0 = blk * cpu::kColumnBlock;
    const std::int64_t width = std::min(cpu::kColumnBlock, C - c0);
    for (std::int64_t r = 0; r < rows; ++r) {
      MT_CHECK(ids[r] >= 0, "embedding_backward: id {} of row {} is negative", ids[r], r);
      float* dst = dtable + static_cast<std::int64_t>(ids[r]) * C + c0;
      const float* src = dout + r * C + c0;
      for (std::int64_t c = 0; c < width; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace meshtrain::kernels
