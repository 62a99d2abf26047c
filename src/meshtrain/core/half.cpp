#include "meshtrain/core/half.h"

#include <bit>

#include "meshtrain/core/error.h"

// Masked 16-bit loads and stores need AVX512BW and AVX512VL besides AVX512F.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MESHTRAIN_HALF_AVX512 1
#include <immintrin.h>
// GCC 12 reports the _mm512_undefined_*() placeholders inside its own intrinsics as "may be
// used uninitialized" where they are inlined (GCC bug 105593), i.e. in this file's code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace meshtrain {

std::uint16_t f32_to_bf16(float x) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  // NaN: truncating could clear every mantissa bit left and give inf; set the quiet bit.
  if ((bits & 0x7fffffffU) > 0x7f800000U) return static_cast<std::uint16_t>((bits >> 16) | 0x40U);
  // Round the low 16 bits away: add just under half an ulp, plus one when the kept part is odd
  // (so an exact half rounds to even). A carry into the exponent is the right result, also
  // the carry from the largest finite values to inf.
  const std::uint32_t odd = (bits >> 16) & 1U;
  return static_cast<std::uint16_t>((bits + 0x7fffU + odd) >> 16);
}

std::uint16_t f32_to_f16(float x) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000U);
  const std::uint32_t abs = bits & 0x7fffffffU;
  if (abs > 0x7f800000U) {  // NaN: quiet, the top 10 payload bits kept (as VCVTPS2PH does)
    return static_cast<std::uint16_t>(sign | 0x7e00U | ((abs >> 13) & 0x3ffU));
  }
  if (abs >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // ≥ 65520, inf
  if (abs >= 0x38800000U) {
    // ≥ 2⁻¹⁴, normal in f16: rebias the exponent (127 → 15, i.e. subtract 112 << 23) and round
    // the 13 low mantissa bits away, ties to even as in f32_to_bf16.
    const std::uint32_t odd = (abs >> 13) & 1U;
    return static_cast<std::uint16_t>(sign | ((abs - 0x38000000U + 0xfffU + odd) >> 13));
  }
  // ≤ 2⁻²⁵, half the smallest subnormal: the tie goes to the even neighbour, zero.
  if (abs <= 0x33000000U) return sign;
  // Subnormal: |x| = m·2^(e−150) with the implicit bit in m; in units of 2⁻²⁴ that is
  // m >> (126 − e), rounded to nearest even by hand. Rounding up from 0x3ff gives 0x400, the
  // smallest normal, which is the right bit pattern too.
  const std::uint32_t e = abs >> 23;  // 102 … 112
  const std::uint32_t m = (abs & 0x7fffffU) | 0x800000U;
  const std::uint32_t shift = 126U - e;  // 14 … 24
  std::uint32_t q = m >> shift;
  const std::uint32_t rest = m & ((1U << shift) - 1U);
  const std::uint32_t half = 1U << (shift - 1U);
  if (rest > half || (rest == half && (q & 1U) != 0)) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

float bf16_to_f32(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

float f16_to_f32(std::uint16_t bits) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(bits) & 0x8000U) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fU;
  const std::uint32_t mantissa = bits & 0x3ffU;
  if (exponent == 0x1fU) return std::bit_cast<float>(sign | 0x7f800000U | (mantissa << 13));
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112U) << 23) | (mantissa << 13));
  }
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // zero or subnormal: exact
  return sign != 0 ? -magnitude : magnitude;
}

namespace {

#ifdef MESHTRAIN_HALF_AVX512
// 16 lanes per step; the tail runs through the same code with masked loads and stores, so
// every element gets the vector arithmetic (which the tests compare with the scalar forms).
constexpr std::int64_t kLanes = 16;

__mmask16 tail_mask(std::int64_t left) {
  return left >= kLanes ? static_cast<__mmask16>(0xffff)
                        : static_cast<__mmask16>((1U << static_cast<unsigned>(left)) - 1U);
}

// f32_to_bf16 on 16 lanes, in integer arithmetic (VCVTNEPS2BF16 would be one instruction, but
// it flushes f32 subnormals to zero, and it needs AVX512_BF16).
__m256i to_bf16(__m512i bits) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
  __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd);
  const __m512 x = _mm512_castsi512_ps(bits);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(bits, _mm512_set1_epi32(0x400000)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}
#endif

}  // namespace

void cast_f32_to_16bit(const float* src, std::uint16_t* dst, std::int64_t n, DType dtype) {
  MT_CHECK(is_16bit_float(dtype) && n >= 0, "cast of {} elements from f32 to {}", n,
           to_string(dtype));
#ifdef MESHTRAIN_HALF_AVX512
  if (dtype == DType::bf16) {
    for (std::int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 mask = tail_mask(n - i);
      _mm256_mask_storeu_epi16(dst + i, mask, to_bf16(_mm512_maskz_loadu_epi32(mask, src + i)));
    }
  } else {
    for (std::int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 mask = tail_mask(n - i);
      // VCVTPS2PH with an explicit round-to-nearest-even: the IEEE conversion, subnormals
      // included, NaN made quiet with the top payload bits kept.
      const __m256i out = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(mask, src + i),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_mask_storeu_epi16(dst + i, mask, out);
    }
  }
#else
  if (dtype == DType::bf16) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
  }
#endif
}

void cast_16bit_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, DType dtype) {
  MT_CHECK(is_16bit_float(dtype) && n >= 0, "cast of {} elements from {} to f32", n,
           to_string(dtype));
#ifdef MESHTRAIN_HALF_AVX512
  if (dtype == DType::bf16) {
    for (std::int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 mask = tail_mask(n - i);
      const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, src + i));
      _mm512_mask_storeu_ps(dst + i, mask, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
    }
  } else {
    for (std::int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 mask = tail_mask(n - i);
      _mm512_mask_storeu_ps(dst + i, mask,
                            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, src + i)));
    }
  }
#else
  if (dtype == DType::bf16) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
  }
#endif
}

}  // namespace meshtrain
