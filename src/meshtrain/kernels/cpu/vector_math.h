// src/meshtrain/kernels/cpu/vector_math.h
//
// exp for float that the compiler can vectorise (exp_approx, for `omp simd` loops) and exp on
// native vectors (exp_approx_vec). glibc's expf/tanhf are scalar calls (glibc declares its
// vector variants only under -ffast-math, which we do not use), and in a GPT step they were
// ≈35 % of the CPU time (perf, GELU's tanh and the attention softmax).
// Private to kernels/cpu.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace meshtrain::kernels::cpu {

/// e^x for x in [-87.3, 88.3] (clamped outside: e^-87.3 ≈ 1e-38 stands in for 0, e^88.3 ≈
/// 2e38 for overflow). Range reduction x = n·ln2 + r with ln2 split in two constants
/// (Cody & Waite 1980) and the degree-7 polynomial of Cephes' expf (Moshier 1989) for e^r on
/// |r| ≤ ln2/2; measured max relative error against exp in double 7.5e-8 (< 1 ulp) on [−87, 88]
/// (ExpApproxKernel test).
/// Branch-free and inline so that loops marked `#pragma omp simd` vectorise.
inline float exp_approx(float x) {
  // Comparisons, not fminf/fmaxf/floorf: those stay library calls and stop vectorisation.
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // round(x / ln 2) by adding and removing 1.5·2²³, which forces rounding to an integer in
  // the default round-to-nearest mode (|x / ln 2| < 128 ≪ 2²²).
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;  // ln2 high part (exact in n·)
  r = r - n * -2.12194440e-4f;     // ln2 low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n built in the exponent field; n in [-126, 127] after the clamp.
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

namespace detail {
/// e^r for r = x − n·ln2 (|r| ≤ ln2/2): exp_approx's reduction and polynomial, on vectors.
template <typename V>
inline V exp_reduced_polynomial(V x, V n) {
  V r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

/// x clamped to exp_approx's [−87.3, 88.3]; NaN stays NaN. On AVX vectors VMAXPS and VMINPS
/// (which return their second operand when it is NaN), in place of the two compares and blends
/// GCC makes of the portable form, which are slower (docs/performance.md, "Figures behind
/// comments in the source").
template <typename V>
inline V clamp_exp_argument(V x) {
#if defined(__AVX__)
  if constexpr (sizeof(V) == sizeof(__m256)) {
    const __m256 c = _mm256_max_ps(_mm256_set1_ps(-87.3f), std::bit_cast<__m256>(x));
    return std::bit_cast<V>(_mm256_min_ps(_mm256_set1_ps(88.3f), c));
  }
#endif
  const V lo = V{} + -87.3f, hi = V{} + 88.3f;
  return x < lo ? lo : (x > hi ? hi : x);
}
}  // namespace detail

/// exp_approx on every lane of a float vector V (vec.h): the same clamp, range reduction and
/// polynomial. Written on vectors because GCC 12, vectorising the scalar form in a loop, turns
/// the clamp into three branches and specialises the code after it for each (the GELU's loop
/// divided twice per vector). On AVX-512 the product p·2ⁿ is one VSCALEFPS in place of the
/// integer conversion and the exponent-field arithmetic (a faster GELU loop: docs/performance.md,
/// "Figures behind comments in the source"). n is rounded as the scalar form rounds it, from
/// one fused multiply-add of x·log2(e) and the rounding constant (the scalar form's multiply
/// and add contract into that FMA under GCC's default -ffp-contract=fast on an FMA target), so
/// the result is exp_approx's bit for bit (ExpApproxKernel test): the attention softmax and
/// the GELU give the same values whichever form a kernel uses. NaN stays NaN. Also for vectors
/// narrower or wider than a zmm, bitwise the scalar form's result: the clamp with VMAXPS and
/// VMINPS on 256-bit vectors (the portable compares elsewhere), 2ⁿ built in the exponent field
/// from the bits of the rounded sum (below).
template <typename V>
inline V exp_approx_vec(V x) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == sizeof(__m512)) {
    // The zero-masking forms with every lane set: the plain intrinsics pass GCC 12's
    // _mm512_undefined_ps() through, which -Wmaybe-uninitialized reports.
    constexpr __mmask16 kAll = 0xFFFF;
    // max(lo, x) and min(hi, ·) return their second operand when it is NaN: NaN stays NaN.
    __m512 c = _mm512_maskz_max_ps(kAll, _mm512_set1_ps(-87.3f), std::bit_cast<__m512>(x));
    c = _mm512_maskz_min_ps(kAll, _mm512_set1_ps(88.3f), c);
    x = std::bit_cast<V>(c);
    constexpr float kRound = 12582912.0f;  // 1.5·2²³, as in exp_approx
    const V n = std::bit_cast<V>(_mm512_fmadd_ps(std::bit_cast<__m512>(x),
                                                 _mm512_set1_ps(1.44269504088896341f),
                                                 _mm512_set1_ps(kRound))) -
                kRound;
    const V p = detail::exp_reduced_polynomial(x, n);
    return std::bit_cast<V>(
        _mm512_maskz_scalef_ps(kAll, std::bit_cast<__m512>(p), std::bit_cast<__m512>(n)));
  }
#endif
  using I [[gnu::vector_size(sizeof(V))]] = std::int32_t;
  x = detail::clamp_exp_argument(x);
  // t = 1.5·2²³ + n exactly (|n| ≤ 128 ≪ 2²²), so n as an integer is t's bit pattern minus
  // that of 1.5·2²³: one integer subtract (folded into the +127) in place of a conversion,
  // which is slower (docs/performance.md, "Figures behind comments in the source").
  constexpr float kRound = 12582912.0f;
  constexpr std::int32_t kRoundBits = std::bit_cast<std::int32_t>(kRound);
  const V t = x * 1.44269504088896341f + kRound;
  const V n = t - kRound;
  const I bits = (std::bit_cast<I>(t) + (127 - kRoundBits)) << 23;
  return detail::exp_reduced_polynomial(x, n) * std::bit_cast<V>(bits);
}

}  // namespace meshtrain::kernels::cpu
