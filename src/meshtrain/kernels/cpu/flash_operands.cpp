// src/meshtrain/kernels/cpu/flash_operands.cpp
//
// The bf16 operand packing and the AVX512_BF16 tile GEMM of the chunk attention kernels
// (flash_operands.h). Kalamkar et al. 2019 ("A Study of BFLOAT16 for Deep Learning Training")
// for bf16 operands with f32 accumulation; the VNNI-2 layout and VDPBF16PS as in Intel's
// Intrinsics Guide (_mm512_dpbf16_ps).
#include "meshtrain/kernels/cpu/flash_operands.h"

#include "meshtrain/core/error.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace meshtrain::kernels::cpu::flash {
namespace {

/// out[c] = the bf16 pair (r0[c], r1[c]) as one 32-bit word (r0 in the low half), c < n; no
/// r1 (an odd last row): (r0[c], 0). Straight-line integer code: GCC vectorises it.
void interleave_rows(const float* r0, const float* r1, std::int64_t n, std::uint32_t* out) {
  if (r1 == nullptr) {
    for (std::int64_t c = 0; c < n; ++c) out[c] = bf16_round_bits(r0[c]) >> 16;
    return;
  }
  for (std::int64_t c = 0; c < n; ++c)
    out[c] = bf16_round_bits(r1[c]) | bf16_round_bits(r0[c]) >> 16;
}

}  // namespace

TilePath tile_path(DType operands) {
  MT_CHECK(operands == DType::f32 || operands == DType::bf16,
           "attention chunk kernels: operands must be f32 or bf16, got {}", to_string(operands));
  if (operands == DType::f32) return TilePath::f32;
  if (kHasAmx && amx_usable()) return TilePath::bf16_amx;
  return kHasBf16Dot ? TilePath::bf16_dot : TilePath::bf16_rounded;
}

TileA pack_a(TilePath path, MatA a, std::int64_t m, std::int64_t k, float* dst) {
  if (path == TilePath::bf16_rounded) {
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t p = 0; p < k; ++p) dst[r * k + p] = bf16_round(a.a[r * a.row + p * a.col]);
    }
    return {{dst, k, 1}, nullptr, 0, 0};
  }
  auto* h = reinterpret_cast<std::uint32_t*>(dst);
  const std::int64_t pairs = (k + 1) / 2;
  if (a.row == 1 && a.col != 1) {  // source rows run along m: word (r, q) at h[q·m + r]
    for (std::int64_t q = 0; q < pairs; ++q) {
      const float* r0 = a.a + 2 * q * a.col;
      interleave_rows(r0, 2 * q + 1 < k ? r0 + a.col : nullptr, m, h + q * m);
    }
    return {{}, h, 1, m};
  }
  for (std::int64_t r = 0; r < m; ++r) {  // source rows run along k: word (r, q) at h[r·pairs + q]
    const float* src = a.a + r * a.row;
    std::uint32_t* out = h + r * pairs;
    for (std::int64_t q = 0; q < k / 2; ++q) {
      out[q] =
          bf16_round_bits(src[(2 * q + 1) * a.col]) | bf16_round_bits(src[2 * q * a.col]) >> 16;
    }
    if (k % 2 != 0) out[k / 2] = bf16_round_bits(src[(k - 1) * a.col]) >> 16;
  }
  return {{}, h, pairs, 1};
}

TileB pack_b(TilePath path, const float* b, std::int64_t ld, std::int64_t k, std::int64_t n,
             float* dst) {
  if (path == TilePath::bf16_rounded) {
    for (std::int64_t p = 0; p < k; ++p) {
      for (std::int64_t c = 0; c < n; ++c) dst[p * n + c] = bf16_round(b[p * ld + c]);
    }
    return {dst, nullptr, n};
  }
  auto* h = reinterpret_cast<std::uint32_t*>(dst);
  for (std::int64_t q = 0; 2 * q < k; ++q) {
    const float* r0 = b + 2 * q * ld;
    interleave_rows(r0, 2 * q + 1 < k ? r0 + ld : nullptr, n, h + q * n);
  }
  return {nullptr, h, n};
}

#if defined(__AVX512BF16__)
namespace {

/// C[kMR, NV·16] = (accumulate ? C : 0) + Σ_q A(r, 2q..2q+1)·B(2q..2q+1, :): kMR × NV
/// accumulators (up to 24 of AVX-512's 32 registers), the B words loaded once per q and each A word
/// (a pair of bf16) broadcast to every lane. Pairs are summed in order q = 0, 1, ….
template <int NV>
void dot_kernel(const TileA& A, const std::uint32_t* a, const std::uint32_t* b, std::int64_t ldb,
                float* c, std::int64_t ldc, std::int64_t pairs, bool accumulate) {
  __m512 acc[kMR][NV];
  for (std::int64_t r = 0; r < kMR; ++r) {
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + v * 16) : _mm512_setzero_ps();
  }
  for (std::int64_t q = 0; q < pairs; ++q) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) {
      bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + q * ldb + v * 16));
    }
    const std::uint32_t* aq = a + q * A.col;
    for (std::int64_t r = 0; r < kMR; ++r) {
      const auto av =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(aq[r * A.row])));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  for (std::int64_t r = 0; r < kMR; ++r) {
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }
}

}  // namespace

void tile_gemm_bf16(const TileA& A, const TileB& B, float* c, std::int64_t ldc, std::int64_t m,
                    std::int64_t n, std::int64_t k, bool accumulate, Causal causal) {
  static_assert(!kHasBf16Dot || kVec == 16);
  MT_CHECK(kHasBf16Dot && n % 16 == 0, "tile_gemm_bf16: needs 16-float vectors (n = {})", n);
  // Whole pairs: a pair straddling the span's edge is summed (its masked half is 0).
  for_each_micro_tile(
      c, ldc, m, n, k, accumulate, causal,
      [&](auto nv, std::int64_t i, std::int64_t j, const TileSpan& span) {
        const std::int64_t q0 = span.k_begin / 2;
        const std::int64_t pairs = std::max<std::int64_t>((span.k_end + 1) / 2 - q0, 0);
        dot_kernel<decltype(nv)::value>(A, A.h + i * A.row + q0 * A.col, B.h + q0 * B.ld + j, B.ld,
                                        c + i * ldc + j, ldc, pairs, accumulate);
      });
}
#else
void tile_gemm_bf16(const TileA&, const TileB&, float*, std::int64_t, std::int64_t, std::int64_t,
                    std::int64_t, bool, Causal) {
  MT_CHECK(false, "tile_gemm_bf16: this build has no AVX512_BF16 (bf16 runs bf16_rounded)");
}
#endif

}  // namespace meshtrain::kernels::cpu::flash
