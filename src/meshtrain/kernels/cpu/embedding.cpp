// src/meshtrain/kernels/cpu/embedding.cpp
//
// Embedding lookup (a row gather) and its backward (a scatter-add into the table), for a
// table holding ids [first, first + table_rows) (Megatron-LM's VocabParallelEmbedding,
// Shoeybi et al. 2019, §3: ids of other ranks give zero rows, and the all-reduce of the
// partial outputs over the tensor-parallel group adds them up). The whole table is the case
// first = 0, table_rows = its row count.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/core/half.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

void check_dims(std::int64_t first, std::int64_t table_rows, std::int64_t rows, std::int64_t C,
                const char* what) {
  MT_CHECK(first >= 0 && table_rows >= 0 && rows >= 0 && C >= 0,
           "{}: bad dims first={} table_rows={} rows={} C={}", what, first, table_rows, rows, C);
}

}  // namespace

void embedding_shard_forward(const std::int32_t* ids, const float* table, std::int64_t first,
                             std::int64_t table_rows, float* out, std::int64_t rows,
                             std::int64_t C) {
  constexpr const char* what = "embedding_shard_forward";
  check_dims(first, table_rows, rows, C, what);
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    MT_CHECK(ids[r] >= 0, "{}: id {} of row {} is negative", what, ids[r], r);
    const std::int64_t local = static_cast<std::int64_t>(ids[r]) - first;
    if (local >= 0 && local < table_rows) {
      std::memcpy(out + r * C, table + local * C, static_cast<std::size_t>(C) * sizeof(float));
    } else {
      std::memset(out + r * C, 0, static_cast<std::size_t>(C) * sizeof(float));
    }
  }
}

void embedding_shard_forward_16bit(const std::int32_t* ids, const std::uint16_t* table, DType dtype,
                                   std::int64_t first, std::int64_t table_rows, float* out,
                                   std::int64_t rows, std::int64_t C) {
  constexpr const char* what = "embedding_shard_forward_16bit";
  check_dims(first, table_rows, rows, C, what);
  MT_CHECK(dtype == DType::bf16 || dtype == DType::f16, "{}: table is {}", what, to_string(dtype));
  // Only the looked-up rows are widened: no f32 copy of the whole table per micro-batch.
#pragma omp parallel for schedule(static) if (rows * C >= cpu::kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    MT_CHECK(ids[r] >= 0, "{}: id {} of row {} is negative", what, ids[r], r);
    const std::int64_t local = static_cast<std::int64_t>(ids[r]) - first;
    if (local >= 0 && local < table_rows) {
      cast_16bit_to_f32(table + local * C, out + r * C, C, dtype);
    } else {
      std::memset(out + r * C, 0, static_cast<std::size_t>(C) * sizeof(float));
    }
  }
}

void embedding_shard_backward(const std::int32_t* ids, const float* dout, std::int64_t first,
                              std::int64_t table_rows, float* dtable, std::int64_t rows,
                              std::int64_t C) {
  constexpr const char* what = "embedding_shard_backward";
  check_dims(first, table_rows, rows, C, what);
  // Repeated ids add into the same table row, so rows cannot be split between threads.
  // Threads own column ranges instead: no races, no atomics, and each table entry receives
  // its rows in order r = 0, 1, … whatever the thread count (bitwise reproducible).
  cpu::for_each_column_range(rows, C, [&](std::int64_t c0, std::int64_t width) {
    for (std::int64_t r = 0; r < rows; ++r) {
      MT_CHECK(ids[r] >= 0, "{}: id {} of row {} is negative", what, ids[r], r);
      const std::int64_t local = static_cast<std::int64_t>(ids[r]) - first;
      if (local < 0 || local >= table_rows) continue;  // another rank's row
      float* dst = dtable + local * C + c0;
      const float* src = dout + r * C + c0;
      for (std::int64_t c = 0; c < width; ++c) dst[c] += src[c];
    }
  });
}

}  // namespace meshtrain::kernels
