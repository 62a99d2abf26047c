// src/meshtrain/kernels/cpu/vec_transpose.h
//
// Private to kernels/cpu: a square block of floats transposed in registers, for kernels that
// keep a per-row order of operations but want each vector lane to be one row (the tiled
// attention's transposed operand packs, LayerNorm's row sums).
//
// Vectors are vec.h's GCC vector extensions.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include "meshtrain/kernels/cpu/vec.h"

namespace meshtrain::kernels::cpu {

namespace detail {
/// One butterfly stage of an N × N transpose in registers: for rows i (bit W clear) and
/// i + W, the off-diagonal W-wide blocks of each 2W × 2W block trade places. After the stages
/// W = N/2, …, 2, 1, row i holds column i. __builtin_shufflevector with constant indices
/// lets GCC pick the permute instructions (vpermt2ps, vunpcklps, …) for each width.
template <int W, typename V, std::size_t... J>
inline void butterfly(V& lo, V& hi, std::index_sequence<J...>) {
  constexpr std::size_t N = sizeof(V) / sizeof(float);
  const V a = lo, b = hi;
  lo = __builtin_shufflevector(a, b, ((J & W) ? N + J - W : J)...);
  hi = __builtin_shufflevector(a, b, ((J & W) ? N + J : J + W)...);
}
template <int W, typename V>
inline void transpose_stage(V* rows) {
  constexpr std::int64_t N = lanes_of<V>;
  for (std::int64_t i = 0; i < N; ++i) {
    if ((i & W) == 0) butterfly<W>(rows[i], rows[i + W], std::make_index_sequence<N>{});
  }
  if constexpr (W > 1) transpose_stage<W / 2>(rows);
}
}  // namespace detail

/// rows ← rowsᵀ for N = lanes_of<V> vectors: afterwards lane l of rows[j] is what lane j of
/// rows[l] was. log2(N) stages of N shuffles; values are moved, never computed on.
template <typename V, std::size_t N>
inline void transpose_in_registers(V (&rows)[N]) {
  static_assert(static_cast<std::int64_t>(N) == lanes_of<V>, "a square block");
  static_assert(N >= 2 && (N & (N - 1)) == 0, "a power-of-two lane count");
  detail::transpose_stage<static_cast<int>(N / 2)>(rows);
}

/// out[j] lane l = m[l·ld + c0 + j] for j, l < N: the N × N block at column c0 of N rows ld
/// floats apart, transposed (lane l of every vector is row l).
template <typename V, std::size_t N>
inline void load_transposed(const float* m, std::int64_t ld, std::int64_t c0, V (&out)[N]) {
  for (std::size_t l = 0; l < N; ++l) std::memcpy(&out[l], m + l * ld + c0, sizeof(V));
  transpose_in_registers(out);
}

}  // namespace meshtrain::kernels::cpu
