// src/meshtrain/kernels/cpu/flash_operands.h
//
// Private to kernels/cpu/flash_*.cpp (and their tests): the operand precision of the chunk
// kernels' tile GEMMs (AttentionChunkDims::operands, kernels.h).
//
// With bf16 operands every tile GEMM operand — Q, K, V, dO and the probabilities P and score
// gradients dS — is rounded to bf16 (round to nearest, ties to even) and the products are
// summed in f32, as FlashAttention-2 does on GPUs (Dao 2023; its CUDA kernels convert P and dS
// to the 16-bit input type before their products, the row sums and statistics stay f32);
// bf16 with f32 accumulation is Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep Learning
// Training", §3. The softmax statistics m, l, lse, D, the outputs and the gradients stay f32.
// The scale 1/√head_dim is folded into Q (forward, backward pass 2) or K (pass 1) before the
// rounding, as the f32 path folds it in: exact for head_dim 16, 64, 256 (a power-of-two
// scale), otherwise one more rounding of relative size ≤ 2⁻⁹ on that operand.
//
// Four paths compute a tile product C (+)= A·B:
//   f32           the f32 micro-kernel of flash_tile.h on the f32 operands as stored;
//   bf16_rounded  (portable) each operand copied, rounded to bf16 but held as f32, then the
//                 same f32 micro-kernel: bf16 × bf16 products are exact in f32 (8 + 8
//                 significant bits ≤ 24), so only the summation differs from bf16_dot;
//   bf16_dot      (AVX512_BF16, 16-float vectors) A and B packed as 32-bit words of bf16
//                 pairs along the reduction dim (B: the VNNI-2 layout), and
//                 _mm512_dpbf16_ps: per lane c += a₂ₚ₊₁·b₂ₚ₊₁ + a₂ₚ·b₂ₚ in f32 (Intel's
//                 pseudocode; bf16 subnormals read as zero).
//   bf16_amx      (AMX-BF16) the same pairs in the layouts AMX tile loads read (A words row-major,
//                 B VNNI-2, both zero-padded to 16 rows and 16 pairs) and TDPBF16PS on 16 × 16
//                 f32 tiles (flash_amx.cpp): about 16 times VDPBF16PS's products per instruction.
// bf16 picks bf16_amx where it is compiled (__AMX_TILE__, __AMX_BF16__, kVec == 16) and the
// kernel grants the tile state (amx_usable), else bf16_dot where compiled (__AVX512BF16__ and
// kVec == 16), else bf16_rounded. All round with bf16_round below (bitwise core/half.h's
// f32_to_bf16), so they differ by f32 summation order only. Packing is O(operand) per tile product: no packed K/V is kept across
// query blocks (each task owns one query or key block and packs the other side per tile).
// Speed: on the project's AVX512_BF16 Xeons VDPBF16PS has the f32 FMA's FLOP rate, so
// bf16_dot is no faster than f32 there; AMX is the fast one (docs/performance.md).
#pragma once

#include <bit>
#include <cstdint>

#include "meshtrain/core/dtype.h"
#include "meshtrain/kernels/cpu/flash_tile.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels::cpu::flash {

#if defined(__AVX512BF16__)
inline constexpr bool kHasBf16Dot = kVec == 16;
#else
inline constexpr bool kHasBf16Dot = false;
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    !defined(MESHTRAIN_FLASH_VEC)
#define MESHTRAIN_FLASH_AMX 1
inline constexpr bool kHasAmx = kVec == 16;
#else
#define MESHTRAIN_FLASH_AMX 0
inline constexpr bool kHasAmx = false;
#endif

enum class TilePath : std::uint8_t { f32, bf16_rounded, bf16_dot, bf16_amx };

/// Whether bf16_amx can run: compiled (kHasAmx), the CPU has AMX-TILE and AMX-BF16, and Linux
/// granted this process the tile state (asked once, on the first call; thread-safe).
bool amx_usable();

/// The path of AttentionChunkDims::operands (f32 or bf16, MT_CHECKed): bf16 → bf16_amx where
/// amx_usable(), else bf16_dot where compiled, else bf16_rounded.
TilePath tile_path(DType operands);

/// The f32 bit pattern of the bf16 nearest to x (ties to even; NaN stays a quiet NaN), i.e.
/// f32_to_bf16(x) << 16 (core/half.h), written branch-free so pack loops vectorise.
inline std::uint32_t bf16_round_bits(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t rounded = (bits + 0x7fffU + ((bits >> 16) & 1U)) & 0xffff0000U;
  const std::uint32_t nan = (bits | 0x00400000U) & 0xffff0000U;
  return (bits & 0x7fffffffU) > 0x7f800000U ? nan : rounded;
}
inline float bf16_round(float x) { return std::bit_cast<float>(bf16_round_bits(x)); }

/// An A operand [m, k] as the path reads it: f (f32, bf16_rounded: an f32 view) or h
/// (bf16_dot: pairs (A(r, 2q), A(r, 2q + 1)) as 32-bit words, the even element in the low
/// half, word (r, q) at h[r·row + q·col]; an odd k pairs its last element with 0). The pack
/// keeps the source's contiguous direction: row-major sources give row = ⌈k/2⌉, col = 1;
/// transposed storage (P and dS read through Sᵀ's rows) gives row = 1, col = m, built from two
/// contiguous source rows at a time like the B operand.
struct TileA {
  MatA f;
  const std::uint32_t* h;
  std::int64_t row, col;
};
/// A B operand [k, n]: f (row-major f32, row stride ld) or h (bf16_dot: VNNI-2, word (q, c) =
/// (B(2q, c), B(2q + 1, c)) at h[q·ld + c], ld = n).
struct TileB {
  const float* f;
  const std::uint32_t* h;
  std::int64_t ld;
};

/// Floats of scratch that tile_a / tile_b need for an operand of `rows` × `cols` (either
/// orientation, any path; bf16_amx pads rows to 16 and the reduction dim to 32 elements).
constexpr std::size_t operand_floats(std::int64_t rows, std::int64_t cols) {
  return static_cast<std::size_t>(round_up(rows, 32) * round_up(cols, 32));
}

/// bf16_amx's packs (flash_amx.cpp): A [m, k] from the f32 view as words [round_up(m, 16),
/// P] with P = ⌈k/2⌉ rounded up to 16 (row = P, col = 1); B [k, n] (n a multiple of 16) as
/// VNNI-2 words [P, n] (ld = n). Padding is zero. MT_CHECK where the build has no AMX.
TileA pack_a_amx(MatA a, std::int64_t m, std::int64_t k, float* dst);
TileB pack_b_amx(const float* b, std::int64_t ld, std::int64_t k, std::int64_t n, float* dst);
/// bf16_amx's tile_gemm: C[m, n] (+)= A·B (n a multiple of 16; m any: no C row ≥ m is touched)
/// from pack_a_amx / pack_b_amx operands; deterministic (flash_amx.cpp). MT_CHECKs AMX.
void tile_gemm_amx(const TileA& A, const TileB& B, float* c, std::int64_t ldc, std::int64_t m,
                   std::int64_t n, std::int64_t k, bool accumulate);

/// The A operand from the f32 view `a` [m, k] (every element readable; padding zero or never
/// read back): the view itself for f32, else a packed copy in dst (operand_floats(m, k)).
TileA pack_a(TilePath path, MatA a, std::int64_t m, std::int64_t k, float* dst);
inline TileA tile_a(TilePath path, MatA a, std::int64_t m, std::int64_t k, float* dst) {
  if (path == TilePath::f32) return {a, nullptr, 0, 0};
  if (path == TilePath::bf16_amx) return pack_a_amx(a, m, k, dst);
  return pack_a(path, a, m, k, dst);
}
/// The B operand from row-major f32 b [k, n] (row stride ld): b itself for f32, else a packed
/// copy in dst (operand_floats(k, n)).
TileB pack_b(TilePath path, const float* b, std::int64_t ld, std::int64_t k, std::int64_t n,
             float* dst);
inline TileB tile_b(TilePath path, const float* b, std::int64_t ld, std::int64_t k, std::int64_t n,
                    float* dst) {
  if (path == TilePath::f32) return {b, nullptr, ld};
  if (path == TilePath::bf16_amx) return pack_b_amx(b, ld, k, n, dst);
  return pack_b(path, b, ld, k, n, dst);
}

/// bf16_dot's tile_gemm: C[m, n] (+)= A·B, m a multiple of kMR, n of kVec (= 16). Each element
/// sums its products in a fixed order whatever m and n (deterministic). `causal` skips as
/// tile_gemm does, the reduction range widened to whole bf16 pairs.
void tile_gemm_bf16(const TileA& A, const TileB& B, float* c, std::int64_t ldc, std::int64_t m,
                    std::int64_t n, std::int64_t k, bool accumulate, Causal causal = {});

/// C[m, n] (+)= A·B on the operands' path (tile_gemm's contract), skipping what `causal`
/// masks on the f32 and bf16_dot paths (Causal; bf16_amx computes whole 16 × 16 tiles, which
/// the masked entries' zeros and selects make equal).
inline void tile_product(TilePath path, const TileA& A, const TileB& B, float* c, std::int64_t ldc,
                         std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate,
                         Causal causal = {}) {
  if (path == TilePath::bf16_amx) return tile_gemm_amx(A, B, c, ldc, m, n, k, accumulate);
  if (path == TilePath::bf16_dot) return tile_gemm_bf16(A, B, c, ldc, m, n, k, accumulate, causal);
  tile_gemm(A.f, B.f, B.ld, c, ldc, m, n, k, accumulate, causal);
}

/// attention_chunk_forward / attention_chunk_backward on an explicit path (they pass
/// tile_path(dims.operands); dims.operands is not read here). Tests compare the paths through
/// these on one machine.
void chunk_forward(TilePath path, const QkvRows& in, const AttentionChunkDims& dims,
                   AttentionMask mask, float* out, std::int64_t out_stride, float* lse);
void chunk_backward(TilePath path, const QkvRows& in, const float* dout, std::int64_t dout_stride,
                    const float* lse, const float* delta, const QkvGradRows& grad,
                    const AttentionChunkDims& dims, AttentionMask mask,
                    GradWrite write = GradWrite::accumulate);

}  // namespace meshtrain::kernels::cpu::flash
