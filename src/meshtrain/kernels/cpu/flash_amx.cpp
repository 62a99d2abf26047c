// src/meshtrain/kernels/cpu/flash_amx.cpp
//
// The AMX-BF16 tile path of the chunk attention kernels (flash_operands.h, TilePath::bf16_amx):
// the operand packs in the layouts AMX tile loads read and the tile GEMM on TDPBF16PS. Intel
// Architecture Instruction Set Extensions Programming Reference (319433), ch. 3 "Intel AMX":
// a tile is up to 16 rows of 64 bytes; TDPBF16PS tC += tA·tB with tA 16 × 16 words (a row of
// bf16 pairs along the reduction dimension), tB 16 × 16 words in the VNNI-2 layout (word (q, c)
// = (B(2q, c), B(2q + 1, c))) and tC 16 × 16 f32, products of bf16 pairs summed in f32 with
// bf16 subnormal inputs and f32 subnormal outputs flushed to zero. Linux makes a process ask
// for the tile state before its first tile instruction (arch_prctl ARCH_REQ_XCOMP_PERM,
// Documentation/arch/x86/xstate.rst); amx_usable() asks once and reports the answer.
//
// Packs: A [m, k] as words [⌈m/16⌉·16, P] (P = ⌈k/2⌉ rounded up to 16 pairs), B [k, n] as words
// [P, n]; the padding is zero, so every tile load reads initialised memory and padded pairs
// add 0·0. tile_gemm_amx computes 2 × 2 blocks of 16 × 16 C tiles per pass over the pairs
// (4 TDPBF16PS per 2 A and 2 B tile loads), 1 × 2, 2 × 1 or 1 × 1 at the edges; every C element
// sums its pairs in the same order (16-pair groups in order, the hardware's order within one
// instruction) whatever m, n and the blocking, so results are deterministic. A last row block
// short of 16 rows goes through a staging buffer: no C row at or beyond m is read or written.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/flash_operands.h"

#if MESHTRAIN_FLASH_AMX
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace meshtrain::kernels::cpu::flash {

#if MESHTRAIN_FLASH_AMX
namespace {

constexpr std::int64_t kTileRows = 16;   // rows of a tile, and C columns per tile (16 f32)
constexpr std::int64_t kTilePairs = 16;  // bf16 pairs per tile row (64 bytes)

std::int64_t padded_pairs(std::int64_t k) { return round_up((k + 1) / 2, kTilePairs); }

/// The tile configuration (palette 1) of tile_gemm_amx: tmm0–3 the 2 × 2 C tiles, tmm4–5 two A
/// tiles, tmm6–7 two B tiles, each 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

/// C tiles [RM·16, RN·16] at c (row stride ldc floats) (+)= A rows [RM·16] · B columns [RN·16]
/// over `pairs` pairs. a: A words (row stride lda words); b: B words (row stride ldb words).
template <int RM, int RN>
void amx_block(const std::uint32_t* a, std::int64_t lda, const std::uint32_t* b, std::int64_t ldb,
               float* c, std::int64_t ldc, std::int64_t pairs, bool accumulate) {
  const std::size_t sa = static_cast<std::size_t>(lda) * 4, sb = static_cast<std::size_t>(ldb) * 4,
                    sc = static_cast<std::size_t>(ldc) * 4;
  const auto c_at = [&](int i, int j) { return c + i * kTileRows * ldc + j * kTileRows; };
  if (accumulate) {
    _tile_loadd(0, c_at(0, 0), sc);
    if constexpr (RN == 2) _tile_loadd(1, c_at(0, 1), sc);
    if constexpr (RM == 2) _tile_loadd(2, c_at(1, 0), sc);
    if constexpr (RM == 2 && RN == 2) _tile_loadd(3, c_at(1, 1), sc);
  } else {
    _tile_zero(0);
    if constexpr (RN == 2) _tile_zero(1);
    if constexpr (RM == 2) _tile_zero(2);
    if constexpr (RM == 2 && RN == 2) _tile_zero(3);
  }
  for (std::int64_t q = 0; q < pairs; q += kTilePairs) {
    _tile_loadd(4, a + q, sa);
    if constexpr (RM == 2) _tile_loadd(5, a + kTileRows * lda + q, sa);
    _tile_loadd(6, b + q * ldb, sb);
    if constexpr (RN == 2) _tile_loadd(7, b + q * ldb + kTileRows, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (RN == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (RM == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (RM == 2 && RN == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c_at(0, 0), sc);
  if constexpr (RN == 2) _tile_stored(1, c_at(0, 1), sc);
  if constexpr (RM == 2) _tile_stored(2, c_at(1, 0), sc);
  if constexpr (RM == 2 && RN == 2) _tile_stored(3, c_at(1, 1), sc);
}

/// C rows [rm·16] (+)= A · B over every column block of n (a multiple of 16).
template <int RM>
void amx_row_block(const std::uint32_t* a, std::int64_t lda, const TileB& B, float* c,
                   std::int64_t ldc, std::int64_t n, std::int64_t pairs, bool accumulate) {
  std::int64_t j = 0;
  for (; j + 2 * kTileRows <= n; j += 2 * kTileRows)
    amx_block<RM, 2>(a, lda, B.h + j, B.ld, c + j, ldc, pairs, accumulate);
  if (j < n) amx_block<RM, 1>(a, lda, B.h + j, B.ld, c + j, ldc, pairs, accumulate);
}

bool request_tile_state() {
  constexpr long kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM, asm/prctl.h
  constexpr long kXtileData = 18;         // XFEATURE_XTILEDATA
  return __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
         syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

/// 16 words (r0[c], r1[c]) for c < 16 (r0 in the low half; r1 nullptr: 0): VCVTNEPS2BF16 on
/// each row, zero-extended and merged.
/// (The maskz forms with every lane set: GCC 12's plain forms start from an "undefined"
/// vector that -Wmaybe-uninitialized reports.)
__m512i pair_words(const float* r0, const float* r1) {
  constexpr __mmask16 kAll = 0xffff;
  const __m512i lo = _mm512_maskz_cvtepu16_epi32(
      kAll, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(r0))));
  if (r1 == nullptr) return lo;
  const __m512i hi = _mm512_maskz_cvtepu16_epi32(
      kAll, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(r1))));
  return _mm512_or_si512(lo, _mm512_maskz_slli_epi32(kAll, hi, 16));
}

/// In place, v[i] lane c ← v[c] lane i: the 16 × 16 transpose of 32-bit words in four stages
/// of unpacks and 128-bit lane shuffles (the standard AVX-512 sequence).
void transpose16(__m512i v[16]) {
  constexpr __mmask16 k16 = 0xffff;  // the maskz forms, as in pair_words
  constexpr __mmask8 k8 = 0xff;
  __m512i a[16], b[16];
  for (int i = 0; i < 16; i += 2) {  // 32-bit interleave of row pairs
    a[i] = _mm512_maskz_unpacklo_epi32(k16, v[i], v[i + 1]);
    a[i + 1] = _mm512_maskz_unpackhi_epi32(k16, v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // lane L of b[i + j]: rows i … i+3 of column 4L + j
    b[i] = _mm512_maskz_unpacklo_epi64(k8, a[i], a[i + 2]);
    b[i + 1] = _mm512_maskz_unpackhi_epi64(k8, a[i], a[i + 2]);
    b[i + 2] = _mm512_maskz_unpacklo_epi64(k8, a[i + 1], a[i + 3]);
    b[i + 3] = _mm512_maskz_unpackhi_epi64(k8, a[i + 1], a[i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // gather each column's four 128-bit quarters
    a[j] = _mm512_maskz_shuffle_i32x4(k16, b[j], b[4 + j], 0x88);
    a[4 + j] = _mm512_maskz_shuffle_i32x4(k16, b[j], b[4 + j], 0xdd);
    a[8 + j] = _mm512_maskz_shuffle_i32x4(k16, b[8 + j], b[12 + j], 0x88);
    a[12 + j] = _mm512_maskz_shuffle_i32x4(k16, b[8 + j], b[12 + j], 0xdd);
  }
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm512_maskz_shuffle_i32x4(k16, a[j], a[8 + j], 0x88);
    v[8 + j] = _mm512_maskz_shuffle_i32x4(k16, a[j], a[8 + j], 0xdd);
    v[4 + j] = _mm512_maskz_shuffle_i32x4(k16, a[4 + j], a[12 + j], 0x88);
    v[12 + j] = _mm512_maskz_shuffle_i32x4(k16, a[4 + j], a[12 + j], 0xdd);
  }
}

/// The word of scalar pairs (x0, x1) as pair_words builds it (x1 absent: pass 0).
std::uint32_t pair_word(float x0, float x1) {
  return bf16_round_bits(x1) | bf16_round_bits(x0) >> 16;
}

}  // namespace

bool amx_usable() {
  static const bool usable = kHasAmx && request_tile_state();
  return usable;
}

// The converts: VCVTNE(2)PS2BF16 round to nearest even like bf16_round, except that f32
// subnormal inputs become ±0 — which TDPBF16PS would read as zero anyway (bf16 subnormal inputs
// are flushed) unless one rounds up to the least normal bf16, 2⁻¹²⁶: a difference no result can
// show above f32 rounding. The scalar tails use bf16_round.
TileA pack_a_amx(MatA a, std::int64_t m, std::int64_t k, float* dst) {
  auto* h = reinterpret_cast<std::uint32_t*>(dst);
  const std::int64_t pairs = padded_pairs(k), mp = round_up(m, kTileRows);
  if (a.row == 1 && a.col != 1) {
    // Source rows run along m (P̃ and dS read through Sᵀ's rows): two source rows make the
    // words of one pair for every r; 16 pairs × 16 rows are transposed in registers.
    const auto row = [&](std::int64_t q, int half) -> const float* {
      return 2 * q + half < k ? a.a + (2 * q + half) * a.col : nullptr;
    };
    const std::int64_t whole = m / 16 * 16;
    for (std::int64_t q0 = 0; q0 < pairs; q0 += 16) {
      for (std::int64_t r0 = 0; r0 < whole; r0 += 16) {
        __m512i v[16];
        for (int i = 0; i < 16; ++i) {
          const float* x0 = row(q0 + i, 0);
          const float* x1 = row(q0 + i, 1);
          v[i] = x0 == nullptr ? _mm512_setzero_si512()
                               : pair_words(x0 + r0, x1 != nullptr ? x1 + r0 : nullptr);
        }
        transpose16(v);
        for (int c = 0; c < 16; ++c) _mm512_storeu_si512(h + (r0 + c) * pairs + q0, v[c]);
      }
    }
    for (std::int64_t r = whole; r < m; ++r) {
      for (std::int64_t q = 0; q < pairs; ++q) {
        const float* x0 = row(q, 0);
        const float* x1 = row(q, 1);
        h[r * pairs + q] = x0 == nullptr ? 0U : pair_word(x0[r], x1 != nullptr ? x1[r] : 0.0f);
      }
    }
  } else {
    for (std::int64_t r = 0; r < m; ++r) {
      const float* src = a.a + r * a.row;
      std::uint32_t* out = h + r * pairs;
      std::int64_t q = 0;
      if (a.col == 1) {  // 16 pairs = 32 contiguous floats per convert
        for (; 2 * q + 32 <= k; q += 16) {
          const __m512bh w =
              _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 2 * q + 16), _mm512_loadu_ps(src + 2 * q));
          _mm512_storeu_si512(out + q, reinterpret_cast<__m512i>(w));
        }
      }
      for (; q < k / 2; ++q) out[q] = pair_word(src[2 * q * a.col], src[(2 * q + 1) * a.col]);
      if (k % 2 != 0) out[q++] = pair_word(src[(k - 1) * a.col], 0.0f);
      std::fill(out + q, out + pairs, 0U);
    }
  }
  std::fill(h + m * pairs, h + mp * pairs, 0U);
  return {{}, h, pairs, 1};
}

TileB pack_b_amx(const float* b, std::int64_t ld, std::int64_t k, std::int64_t n, float* dst) {
  MT_CHECK(n % kTileRows == 0, "pack_b_amx: n = {} is not a multiple of 16", n);
  auto* h = reinterpret_cast<std::uint32_t*>(dst);
  const std::int64_t pairs = padded_pairs(k), used = (k + 1) / 2;
  for (std::int64_t q = 0; q < used; ++q) {
    const float* r0 = b + 2 * q * ld;
    const float* r1 = 2 * q + 1 < k ? r0 + ld : nullptr;
    std::uint32_t* out = h + q * n;
    for (std::int64_t c = 0; c < n; c += 16)
      _mm512_storeu_si512(out + c, pair_words(r0 + c, r1 != nullptr ? r1 + c : nullptr));
  }
  std::fill(h + used * n, h + pairs * n, 0U);
  return {nullptr, h, n};
}

void tile_gemm_amx(const TileA& A, const TileB& B, float* c, std::int64_t ldc, std::int64_t m,
                   std::int64_t n, std::int64_t k, bool accumulate) {
  MT_CHECK(amx_usable() && n % kTileRows == 0 && A.col == 1 && A.row == padded_pairs(k),
           "tile_gemm_amx: needs AMX, n a multiple of 16 (n = {}) and pack_a_amx's A", n);
  static const TileConfig config;
  _tile_loadconfig(&config);  // every call: oneDNN's AMX GEMMs load their own configuration
  const std::int64_t pairs = A.row, whole = m / kTileRows * kTileRows;
  std::int64_t i = 0;
  for (; i + 2 * kTileRows <= whole; i += 2 * kTileRows)
    amx_row_block<2>(A.h + i * pairs, pairs, B, c + i * ldc, ldc, n, pairs, accumulate);
  if (i < whole) amx_row_block<1>(A.h + i * pairs, pairs, B, c + i * ldc, ldc, n, pairs, accumulate);
  if (whole < m) {  // the last rows through a 16-row staging copy of C
    thread_local std::vector<float> stage;
    stage.assign(static_cast<std::size_t>(kTileRows * n), 0.0f);
    const std::int64_t rows = m - whole;
    if (accumulate) {
      for (std::int64_t r = 0; r < rows; ++r)
        std::memcpy(&stage[r * n], c + (whole + r) * ldc, static_cast<std::size_t>(n) * 4);
    }
    amx_row_block<1>(A.h + whole * pairs, pairs, B, stage.data(), n, n, pairs, accumulate);
    for (std::int64_t r = 0; r < rows; ++r)
      std::memcpy(c + (whole + r) * ldc, &stage[r * n], static_cast<std::size_t>(n) * 4);
  }
}

#else  // no AMX in this build

bool amx_usable() { return false; }
TileA pack_a_amx(MatA, std::int64_t, std::int64_t, float*) {
  MT_CHECK(false, "pack_a_amx: this build has no AMX-BF16");
  return {};
}
TileB pack_b_amx(const float*, std::int64_t, std::int64_t, std::int64_t, float*) {
  MT_CHECK(false, "pack_b_amx: this build has no AMX-BF16");
  return {};
}
void tile_gemm_amx(const TileA&, const TileB&, float*, std::int64_t, std::int64_t, std::int64_t,
                   std::int64_t, bool) {
  MT_CHECK(false, "tile_gemm_amx: this build has no AMX-BF16");
}

#endif

}  // namespace meshtrain::kernels::cpu::flash
