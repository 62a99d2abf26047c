// src/meshtrain/kernels/cpu/flash_tile.h
//
// Private to kernels/cpu/flash_attention*.cpp: the block sizes, the register-blocked GEMM
// micro-kernel, the packing of q/k/v rows into block scratch and the argument checks of the
// chunk-pair attention kernels (kernels.h, attention_chunk_*).
//
// Vectors are GCC vector extensions (`vector_size`), not intrinsics: one source for AVX2
// (8 floats, this project's AMD machines), AVX-512 (16 floats, chosen by __AVX512F__ under
// -march=native) and anything else (GCC splits a vector it cannot hold into narrower ones, so
// the portable fallback is the same code). MESHTRAIN_FLASH_VEC overrides the width, which lets
// an AVX2 machine build and test the 16-wide AVX-512 layout.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/vec_transpose.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels::cpu::flash {

#if defined(MESHTRAIN_FLASH_VEC)
inline constexpr std::int64_t kVec = MESHTRAIN_FLASH_VEC;
#else
inline constexpr std::int64_t kVec = kLanes;
#endif

using VecF = FloatVec<kVec>;

/// Rows of the micro-kernel's C tile: 6 rows × 2 vectors = 12 accumulators, which with the 2
/// B vectors and the broadcast A value is 15 of AVX2's 16 registers (BLIS's Haswell 6×16
/// shape). 4 × 2 left GCC folding the B loads into every FMA (12 loads per 8 FMAs) and ran
/// the forward at ≈ 20 GFLOP/s against ≈ 30 with 6 × 2 (attention_bench, docs/performance.md).
inline constexpr std::int64_t kMR = 6;
/// Query rows (Br) and key rows (Bc) of a block (FlashAttention-2's B_r, B_c). Both are
/// multiples of kMR and of 2·kVec for AVX-512 (tile GEMMs then run whole micro-kernels). A
/// [96, 48] f32 tile is 18 KiB: the operands of one tile GEMM stay in L1/L2. 48/48, 96/48 and
/// 96/96 measured within noise of each other; 96 queries per block halve the K/V reads per
/// FLOP against 48. Since the micro-kernels skip the masked part of a causal diagonal tile
/// (Causal below), 96/96, 192/48 and 48/48 measured within noise of 96/48 too.
inline constexpr std::int64_t kBr = 96;
inline constexpr std::int64_t kBc = 48;
static_assert(kBr % kMR == 0 && kBc % kMR == 0 && kBr % kVec == 0 && kBc % kVec == 0);

constexpr std::int64_t round_up(std::int64_t n, std::int64_t to) { return (n + to - 1) / to * to; }

inline VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, const VecF& v) { std::memcpy(p, &v, sizeof v); }

/// 32-bit integer lanes as many as VecF's: the column indices the causal mask compares.
using VecI [[gnu::vector_size(sizeof(VecF))]] = std::int32_t;
/// Lane i holds first + i: one load of a constant and one add (GCC 12 builds a vector filled
/// lane by lane as 16 masked broadcasts).
inline VecI lane_indices(int first) {
  alignas(64) static constexpr std::int32_t kIota[16] = {0, 1, 2,  3,  4,  5,  6,  7,
                                                         8, 9, 10, 11, 12, 13, 14, 15};
  static_assert(kVec <= 16);
  VecI v;
  std::memcpy(&v, kIota, sizeof v);
  return v + first;
}
/// Every lane = a, one vbroadcastss: x − 0 is x for every x (−0 included), so GCC drops the
/// subtraction; `a + VecF{}` keeps an add (−0 + 0 = +0), and a lane-by-lane fill compiles to
/// a chain of vinsertps.
inline VecF broadcast(float a) { return a - VecF{}; }

/// The A operand of a tile GEMM: element (r, p) at a[r·row + p·col]. Row-major A is {a, lda,
/// 1}; the transpose of a row-major [k, m] buffer is {a, 1, ld}: both are broadcast one
/// element at a time, so the kernel needs no transposed copy of either.
struct MatA {
  const float* a;
  std::int64_t row;
  std::int64_t col;
};

/// C[kMR, NV·kVec] = (accumulate ? C : 0) + Σ_p A(r, p)·B[p, :]; B and C row-major. The
/// products are summed in p order 0, 1, …, k−1 (one FMA chain per element).
template <int NV>
inline void micro_kernel(MatA A, const float* b, std::int64_t ldb, float* c, std::int64_t ldc,
                         std::int64_t k, bool accumulate) {
  VecF acc[kMR][NV];
  for (std::int64_t r = 0; r < kMR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? load(c + r * ldc + v * kVec) : VecF{};
  }
  for (std::int64_t p = 0; p < k; ++p) {
    VecF bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load(b + p * ldb + v * kVec);
    const float* ap = A.a + p * A.col;
    for (std::int64_t r = 0; r < kMR; ++r) {
      const VecF av = broadcast(ap[r * A.row]);
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (std::int64_t r = 0; r < kMR; ++r) {
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * kVec, acc[r][v]);
  }
}

/// Vectors of C per micro-kernel call: with AVX-512's 32 registers a 6 × 4 tile (24
/// accumulators, 4 B vectors and the broadcast A value: 29 registers) does 24 FMAs per 10
/// loads, against 12 per 8 for 6 × 2; AVX2's 16 registers hold 6 × 2 only.
inline constexpr int kNV = kVec == 16 ? 4 : 2;

/// Which part of a tile product the causal mask leaves, per micro-kernel row block: block
/// skipping (FlashAttention-2, Dao 2023, §3.1.1 skips whole masked blocks) carried down to
/// the kMR rows of one micro-kernel call, so the diagonal tiles compute about half their
/// products instead of all of them. In the tile's own indices a key sees a query iff
/// key ≤ query + diag (diag = q_offset + i0 − kv_offset − j0). Which index the rows, the
/// columns and the reduction dimension are decides the kind:
///   cols_from  rows keys, columns queries (Sᵀ, dPᵀ): columns below the block's first visible
///              query are skipped (whole vectors) and, in a product that does not accumulate,
///              written as 0;
///   cols_upto  rows queries, columns keys (S, dP): columns past the block's last visible key
///              likewise;
///   k_from     rows keys, k queries (dV += Pᵀ·dO, dK += dSᵀ·Q): the sum starts at the
///              block's first visible query;
///   k_upto     rows queries, k keys (O += P·V, dQ += dS·K): the sum stops after the block's
///              last visible key.
/// A skipped product has a masked factor (P, dS = 0 there; S, dP are never read there), so
/// every kept element sums the same products in the same order: the results are those of the
/// full tile bit for bit, but for the sign of an exact zero.
struct Causal {
  enum class Kind : std::uint8_t { none, cols_from, cols_upto, k_from, k_upto };
  Kind kind = Kind::none;
  std::int64_t diag = 0;
};

/// Causal{kind, diag} where mask is causal, else no skipping.
inline Causal causal_tile(AttentionMask mask, Causal::Kind kind, std::int64_t diag) {
  return mask == AttentionMask::causal ? Causal{kind, diag} : Causal{};
}

/// The columns [col_begin, col_end) and reduction range [k_begin, k_end) that micro-kernel
/// rows [i, i + kMR) of an [m, n] × k product compute under `causal` (col_* multiples of kVec
/// when n is).
struct TileSpan {
  std::int64_t col_begin, col_end, k_begin, k_end;
};
inline TileSpan causal_span(Causal causal, std::int64_t i, std::int64_t n, std::int64_t k) {
  TileSpan s{0, n, 0, k};
  switch (causal.kind) {
    case Causal::Kind::none:
      break;
    case Causal::Kind::cols_from:
      s.col_begin = std::clamp(i - causal.diag, std::int64_t{0}, n) / kVec * kVec;
      break;
    case Causal::Kind::cols_upto:
      s.col_end =
          std::min(n, round_up(std::clamp(i + kMR + causal.diag, std::int64_t{0}, n), kVec));
      break;
    case Causal::Kind::k_from:
      s.k_begin = std::clamp(i - causal.diag, std::int64_t{0}, k);
      break;
    case Causal::Kind::k_upto:
      s.k_end = std::clamp(i + kMR + causal.diag, std::int64_t{0}, k);
      break;
  }
  return s;
}

/// Zeroes columns [0, span.col_begin) and [span.col_end, n) of kMR rows of C.
inline void zero_outside_span(float* c, std::int64_t ldc, std::int64_t n, const TileSpan& span) {
  for (std::int64_t r = 0; r < kMR; ++r) {
    std::fill(c + r * ldc, c + r * ldc + span.col_begin, 0.0f);
    std::fill(c + r * ldc + span.col_end, c + r * ldc + n, 0.0f);
  }
}

/// The loop the vector tile GEMMs share (tile_gemm below, tile_gemm_bf16 in
/// flash_operands.cpp) over C[m, n] (+)= A·B, m a multiple of kMR, n of kVec: per kMR-row block
/// i, the span `causal` leaves (causal_span); the columns outside it written as 0 when the
/// product does not accumulate; a block with nothing to sum skipped when it does; then
/// kernel(nv, i, j, span) over the span's columns in calls of kNV vectors and one of 3, 2 or 1
/// for the rest (nv a std::integral_constant<int, NV>, j the call's first column).
template <class Kernel>
inline void for_each_micro_tile(float* c, std::int64_t ldc, std::int64_t m, std::int64_t n,
                                std::int64_t k, bool accumulate, Causal causal, Kernel&& kernel) {
  for (std::int64_t i = 0; i < m; i += kMR) {
    const TileSpan span = causal_span(causal, i, n, k);
    if (!accumulate) zero_outside_span(c + i * ldc, ldc, n, span);
    if (accumulate && span.k_end <= span.k_begin) continue;  // adds nothing
    std::int64_t j = span.col_begin;
    for (; j + kNV * kVec <= span.col_end; j += kNV * kVec)
      kernel(std::integral_constant<int, kNV>{}, i, j, span);
    const std::int64_t rest = (span.col_end - j) / kVec;
    if constexpr (kNV == 4) {
      if (rest == 3) kernel(std::integral_constant<int, 3>{}, i, j, span);
      if (rest == 2) kernel(std::integral_constant<int, 2>{}, i, j, span);
    }
    if (rest == 1) kernel(std::integral_constant<int, 1>{}, i, j, span);
  }
}

/// C[m, n] (+)= A[m, k]·B[k, n]: m a multiple of kMR, n of kVec, ldb and ldc too (B and C
/// row-major). Every element sums its k products in order, whatever m and n: the micro-kernel
/// widths (kNV, then 3, 2, 1 vectors for the rest of n) change no result bit. `causal` skips
/// the products the mask zeroes (Causal); an empty sum without accumulate writes 0.
inline void tile_gemm(MatA A, const float* b, std::int64_t ldb, float* c, std::int64_t ldc,
                      std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate,
                      Causal causal = {}) {
  for_each_micro_tile(c, ldc, m, n, k, accumulate, causal,
                      [&](auto nv, std::int64_t i, std::int64_t j, const TileSpan& span) {
                        const MatA Ai{A.a + i * A.row + span.k_begin * A.col, A.row, A.col};
                        const std::int64_t kk =
                            std::max<std::int64_t>(span.k_end - span.k_begin, 0);
                        micro_kernel<decltype(nv)::value>(Ai, b + span.k_begin * ldb + j, ldb,
                                                          c + i * ldc + j, ldc, kk, accumulate);
                      });
}

/// dst [rows_padded, ld] ← rows [0, n) of src (row stride `stride`, hd floats each); columns
/// [hd, ld) and rows [n, rows_padded) are zero, so padding never carries stale values (or NaN)
/// into a tile GEMM.
inline void pack_rows(const float* src, std::int64_t stride, std::int64_t n, std::int64_t hd,
                      std::int64_t ld, std::int64_t rows_padded, float* dst) {
  for (std::int64_t r = 0; r < n; ++r) {
    std::memcpy(dst + r * ld, src + r * stride, static_cast<std::size_t>(hd) * sizeof(float));
    std::fill(dst + r * ld + hd, dst + (r + 1) * ld, 0.0f);
  }
  std::fill(dst + n * ld, dst + rows_padded * ld, 0.0f);
}

/// pack_rows with every element multiplied by scale: dst [rows_padded, ld] ← scale · rows
/// [0, n) of src, zero padding.
inline void pack_rows_scaled(const float* src, std::int64_t stride, std::int64_t n, std::int64_t hd,
                             float scale, std::int64_t ld, std::int64_t rows_padded, float* dst) {
  for (std::int64_t r = 0; r < n; ++r) {
    const float* s = src + r * stride;
    float* o = dst + r * ld;
    for (std::int64_t c = 0; c < hd; ++c) o[c] = scale * s[c];
    std::fill(o + hd, o + ld, 0.0f);
  }
  std::fill(dst + n * ld, dst + rows_padded * ld, 0.0f);
}

/// Whether the backward runs fused (one task per (sequence, kv head), 5 tile products per tile
/// pair, dQ in a task-local buffer) rather than as two passes (7 products, finer tasks): with
/// one thread always, else when there are ≥ 2 tasks per thread to balance. Both schedules give
/// bitwise the same results (flash_attention_backward.cpp), so this changes speed only.
inline bool fused_backward(std::int64_t kv_tasks, int threads) {
  return threads <= 1 || kv_tasks >= 2 * std::int64_t{threads};
}

/// A GEMM operand of rows with `ld` floats between rows.
struct Rows {
  const float* p;
  std::int64_t ld;
};

/// Rows [0, n) of src as a tile operand of hdp columns and round_up(n, kMR) rows: src itself
/// when the block is whole (n == full, a multiple of kMR) and head_dim fills whole vectors,
/// since then no read leaves the head's columns or the chunk's rows; else a zero-padded copy
/// in dst. Skipping the copy saves a pass over K and V per tile.
inline Rows rows_operand(const float* src, std::int64_t stride, std::int64_t n, std::int64_t full,
                         std::int64_t hd, std::int64_t hdp, float* dst) {
  if (n == full && hd == hdp) return {src, stride};
  pack_rows(src, stride, n, hd, hdp, round_up(n, kMR), dst);
  return {dst, hdp};
}

/// dst [hd, ld] ← scale · (rows [0, n) of src)ᵀ; columns [n, cols_padded) are zero. Whole
/// kVec × kVec blocks are transposed in registers (one load, one multiply and one store per
/// vector, log2(kVec) shuffle stages): an element-by-element copy stores one float at a time
/// from a vector lane, and measured ≈ 5 % of attention_bench's samples at T = 256. Products
/// and results are those of the element-by-element copy (one multiply per element).
inline void pack_transposed(const float* src, std::int64_t stride, std::int64_t n, std::int64_t hd,
                            float scale, std::int64_t ld, std::int64_t cols_padded, float* dst) {
  const std::int64_t n_whole = n / kVec * kVec, hd_whole = hd / kVec * kVec;
  for (std::int64_t r0 = 0; r0 < n_whole; r0 += kVec) {
    for (std::int64_t c0 = 0; c0 < hd_whole; c0 += kVec) {
      VecF rows[kVec];
      for (std::int64_t i = 0; i < kVec; ++i) rows[i] = scale * load(src + (r0 + i) * stride + c0);
      transpose_in_registers(rows);
      for (std::int64_t i = 0; i < kVec; ++i) store(dst + (c0 + i) * ld + r0, rows[i]);
    }
  }
  // The edges, element by element: the columns past the whole blocks of the rows in blocks,
  // then every column of the rows past them.
  for (std::int64_t r = 0; r < n; ++r) {
    const float* s = src + r * stride;
    const std::int64_t c_begin = r < n_whole ? hd_whole : 0;
    for (std::int64_t c = c_begin; c < hd; ++c) dst[c * ld + r] = scale * s[c];
  }
  for (std::int64_t c = 0; c < hd; ++c)
    std::fill(dst + c * ld + n, dst + c * ld + cols_padded, 0.0f);
}

/// The sizes every chunk kernel derives from AttentionChunkDims.
struct ChunkGeometry {
  std::int64_t group;  // query heads per kv head
  std::int64_t hdp;    // head_dim rounded up to a whole vector (packed row width)
  std::int64_t q_blocks, kv_blocks;
  float scale;  // 1/√head_dim
};

/// In the tile (query block at i0, key block at j0) key row j sees query column r iff
/// r ≥ first_visible(j): causal is kv_offset + j0 + j ≤ q_offset + i0 + r, i.e. r ≥ j − diag
/// with diag = q_offset + i0 − kv_offset − j0. Clamped to [0, kBr] and returned as int: the
/// column loops compare 32-bit lanes, as wide as their floats, which GCC vectorises (64-bit
/// compares against float lanes it does not).
inline int first_visible(AttentionMask mask, std::int64_t diag, std::int64_t j) {
  if (mask != AttentionMask::causal) return 0;
  return static_cast<int>(std::clamp(j - diag, std::int64_t{0}, kBr));
}

/// Keys [0, end) of the chunk that some query of the block [i0, i0 + br) sees.
inline std::int64_t visible_kv_end(const AttentionChunkDims& d, AttentionMask mask, std::int64_t i0,
                                   std::int64_t br) {
  if (mask == AttentionMask::skip) return 0;
  if (mask == AttentionMask::full) return d.kv_len;
  return std::clamp(d.q_offset + i0 + br - d.kv_offset, std::int64_t{0}, d.kv_len);
}

/// Queries [begin, q_len) of the chunk that see some key of the block starting at j0.
inline std::int64_t visible_q_begin(const AttentionChunkDims& d, AttentionMask mask,
                                    std::int64_t j0) {
  if (mask == AttentionMask::skip) return d.q_len;
  if (mask == AttentionMask::full) return 0;
  return std::clamp(d.kv_offset + j0 - d.q_offset, std::int64_t{0}, d.q_len);
}

/// MT_CHECKs the query-side dims (all that merge and delta read); `what` names the caller.
inline void check_query_dims(const AttentionChunkDims& d, const char* what) {
  MT_CHECK(d.batch >= 0 && d.q_len >= 0 && d.heads > 0 && d.head_dim > 0 &&
               d.q_seq_rows >= d.q_len && d.lse_seq_len >= d.q_len,
           "{}: bad dims batch={} q_len={} heads={} head_dim={} q_seq_rows={} lse_seq_len={}", what,
           d.batch, d.q_len, d.heads, d.head_dim, d.q_seq_rows, d.lse_seq_len);
}

/// MT_CHECKs every dim and the row strides of q (and out/dout: q_side_stride) and k, v.
inline ChunkGeometry check_chunk_dims(const AttentionChunkDims& d, std::int64_t q_stride,
                                      std::int64_t kv_stride, std::int64_t q_side_stride,
                                      const char* what) {
  check_query_dims(d, what);
  MT_CHECK(
      d.kv_len >= 0 && d.kv_heads > 0 && d.heads % d.kv_heads == 0 && d.kv_seq_rows >= d.kv_len,
      "{}: bad dims kv_len={} heads={} kv_heads={} kv_seq_rows={}", what, d.kv_len, d.heads,
      d.kv_heads, d.kv_seq_rows);
  MT_CHECK(q_stride >= d.heads * d.head_dim && q_side_stride >= d.heads * d.head_dim &&
               kv_stride >= d.kv_heads * d.head_dim,
           "{}: row strides q={} out={} kv={} narrower than heads·head_dim={} / "
           "kv_heads·head_dim={}",
           what, q_stride, q_side_stride, kv_stride, d.heads * d.head_dim, d.kv_heads * d.head_dim);
  return {d.heads / d.kv_heads, round_up(d.head_dim, kVec), (d.q_len + kBr - 1) / kBr,
          (d.kv_len + kBc - 1) / kBc, 1.0f / std::sqrt(static_cast<float>(d.head_dim))};
}

}  // namespace meshtrain::kernels::cpu::flash
