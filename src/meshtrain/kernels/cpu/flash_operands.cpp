// src/meshtrain/kernels/cpu/flash_operands.cpp
//
// The bf16 operand packing and the AVX512_BF16 tile GEMM of the chunk attention kernels
// (flash_operands.h). Kalamkar et al. 2019 ("A Study of BFLOAT16 for Deep Learning Training")
// for bf16 operands with f32 accumulation; the VNNI-2 layout and VDPBF16PS as in Intel's
// Intrinsics Guide (_mm512_dpbf16_ps).
#include "meshtrain/kernels/cpu/flash_operands.h"

#include <cstring>

#include "meshtrain/core/error.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace meshtrain::kernels::cpu::flash {
namespace {

std::uint16_t bf16_bits(float x) { return static_cast<std::uint16_t>(bf16_round_bits(x) >> 16); }

/// dst[r·ld + p] ← f(a(r, p)) for r < m, p < k; the loop runs along whichever of a's strides
/// is 1, so the reads are contiguous (P and dS are read through their transposed storage).
template <class T, class F>
void pack_rows_of(MatA a, std::int64_t m, std::int64_t k, T* dst, std::int64_t ld, F f) {
  if (a.row == 1 && a.col != 1) {
    for (std::int64_t p = 0; p < k; ++p) {
      const float* src = a.a + p * a.col;
      for (std::int64_t r = 0; r < m; ++r) dst[r * ld + p] = f(src[r]);
    }
    return;
  }
  for (std::int64_t r = 0; r < m; ++r) {
    const float* src = a.a + r * a.row;
    for (std::int64_t p = 0; p < k; ++p) dst[r * ld + p] = f(src[p * a.col]);
  }
}

}  // namespace

TilePath tile_path(DType operands) {
  MT_CHECK(operands == DType::f32 || operands == DType::bf16,
           "attention chunk kernels: operands must be f32 or bf16, got {}", to_string(operands));
  if (operands == DType::f32) return TilePath::f32;
  return kHasBf16Dot ? TilePath::bf16_dot : TilePath::bf16_rounded;
}

TileA pack_a(TilePath path, MatA a, std::int64_t m, std::int64_t k, float* dst) {
  if (path == TilePath::bf16_rounded) {
    pack_rows_of(a, m, k, dst, k, bf16_round);
    return {{dst, k, 1}, nullptr, 0};
  }
  // bf16_dot: rows of round_up(k, 2) elements; an odd k gets a zero partner in the last pair.
  auto* h = reinterpret_cast<std::uint16_t*>(dst);
  const std::int64_t ld = round_up(k, 2);
  pack_rows_of(a, m, k, h, ld, bf16_bits);
  if (ld != k) {
    for (std::int64_t r = 0; r < m; ++r) h[r * ld + k] = 0;
  }
  return {{}, h, ld};
}

TileB pack_b(TilePath path, const float* b, std::int64_t ld, std::int64_t k, std::int64_t n,
             float* dst) {
  if (path == TilePath::bf16_rounded) {
    for (std::int64_t p = 0; p < k; ++p) {
      for (std::int64_t c = 0; c < n; ++c) dst[p * n + c] = bf16_round(b[p * ld + c]);
    }
    return {dst, nullptr, n};
  }
  // bf16_dot, VNNI-2: the 32-bit lane c of pair row q holds (B[2q, c], B[2q + 1, c]).
  auto* h = reinterpret_cast<std::uint16_t*>(dst);
  for (std::int64_t p = 0; p < k; p += 2) {
    const float* r0 = b + p * ld;
    const float* r1 = r0 + ld;
    std::uint16_t* out = h + p * n;  // pair row p / 2 starts at (p / 2)·n·2
    if (p + 1 < k) {
      for (std::int64_t c = 0; c < n; ++c) {
        out[2 * c] = bf16_bits(r0[c]);
        out[2 * c + 1] = bf16_bits(r1[c]);
      }
    } else {
      for (std::int64_t c = 0; c < n; ++c) {
        out[2 * c] = bf16_bits(r0[c]);
        out[2 * c + 1] = 0;
      }
    }
  }
  return {nullptr, h, n};
}

#if defined(__AVX512BF16__)
namespace {

/// C[kMR, NV·16] = (accumulate ? C : 0) + Σ_q A(r, 2q..2q+1)·B(2q..2q+1, :): kMR × NV
/// accumulators (12 of AVX-512's 32 registers), the B pairs loaded once per q and each A pair
/// broadcast as one 32-bit lane. Pairs are summed in order q = 0, 1, ….
template <int NV>
void dot_kernel(const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb,
                float* c, std::int64_t ldc, std::int64_t pairs, bool accumulate) {
  __m512 acc[kMR][NV];
  for (std::int64_t r = 0; r < kMR; ++r) {
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + v * 16) : _mm512_setzero_ps();
  }
  for (std::int64_t q = 0; q < pairs; ++q) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) {
      bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + (q * ldb + v * 16) * 2));
    }
    for (std::int64_t r = 0; r < kMR; ++r) {
      std::int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * q, sizeof pair);
      const auto av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  for (std::int64_t r = 0; r < kMR; ++r) {
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }
}

}  // namespace

void tile_gemm_bf16(const TileA& A, const TileB& B, float* c, std::int64_t ldc, std::int64_t m,
                    std::int64_t n, std::int64_t k, bool accumulate) {
  static_assert(!kHasBf16Dot || kVec == 16);
  MT_CHECK(kHasBf16Dot && n % 16 == 0, "tile_gemm_bf16: needs 16-float vectors (n = {})", n);
  const std::int64_t pairs = (k + 1) / 2;
  for (std::int64_t i = 0; i < m; i += kMR) {
    const std::uint16_t* a = A.h + i * A.ld;
    std::int64_t j = 0;
    for (; j + 32 <= n; j += 32)
      dot_kernel<2>(a, A.ld, B.h + 2 * j, B.ld, c + i * ldc + j, ldc, pairs, accumulate);
    if (j < n) dot_kernel<1>(a, A.ld, B.h + 2 * j, B.ld, c + i * ldc + j, ldc, pairs, accumulate);
  }
}
#else
void tile_gemm_bf16(const TileA&, const TileB&, float*, std::int64_t, std::int64_t, std::int64_t,
                    std::int64_t, bool) {
  MT_CHECK(false, "tile_gemm_bf16: this build has no AVX512_BF16 (bf16 runs bf16_rounded)");
}
#endif

}  // namespace meshtrain::kernels::cpu::flash
