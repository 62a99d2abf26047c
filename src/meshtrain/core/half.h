// src/meshtrain/core/half.h
//
// Conversions between f32 and the two 16-bit float formats of mixed-precision training
// (docs/mixed_precision.md): bf16 (1 sign, 8 exponent, 7 mantissa bits: f32's range, 3 decimal
// digits less; Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep Learning Training") and
// f16 (IEEE 754 binary16: 1, 5, 10 bits; largest finite 65504, smallest normal 2⁻¹⁴, smallest
// subnormal 2⁻²⁴). A 16-bit value is stored as its bit pattern in a std::uint16_t.
//
// f32 → 16-bit rounds to nearest, ties to even (IEEE 754 roundTiesToEven, as PyTorch's
// .to(torch.bfloat16 / torch.float16)); NaN stays NaN (made quiet, sign and the top payload bits
// kept); ±inf stays ±inf; f16 overflow (|x| ≥ 65520, the midpoint between 65504 and 2¹⁶) gives
// ±inf; values below f16's normal range become f16 subnormals, rounded the same way (no flush
// to zero). bf16 covers f32's exponent range, so it only overflows when rounding carries past
// the largest f32 (|x| ≥ 2¹²⁸·(1 − 2⁻⁹)), and f32 subnormals map to bf16 subnormals.
// 16-bit → f32 is exact.
//
// The bulk forms are single-threaded and use AVX-512 when the build targets it (-march=native
// on the project's machines), with results bitwise those of the scalar forms: the casts run on
// every linear layer's input each micro-batch, and a loop of scalar conversions would cost a
// visible fraction of a bf16 GEMM.
#pragma once

#include <cstdint>

#include "meshtrain/core/dtype.h"

namespace meshtrain {

/// The nearest bf16 to x (ties to even).
std::uint16_t f32_to_bf16(float x) noexcept;
/// The nearest f16 to x (ties to even; beyond ±65504 rounds to ±inf as IEEE 754 says).
std::uint16_t f32_to_f16(float x) noexcept;
/// Exact.
float bf16_to_f32(std::uint16_t bits) noexcept;
float f16_to_f32(std::uint16_t bits) noexcept;

/// True for DType::bf16 and DType::f16, the dtypes stored as std::uint16_t.
constexpr bool is_16bit_float(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

/// dst[i] = src[i] rounded to `dtype` (bf16 or f16, MT_CHECKed), i < n. src [n] f32, dst [n].
/// The buffers must not overlap.
void cast_f32_to_16bit(const float* src, std::uint16_t* dst, std::int64_t n, DType dtype);
/// dst[i] = src[i] widened exactly to f32, i < n; src [n] of `dtype` (bf16 or f16, MT_CHECKed).
void cast_16bit_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, DType dtype);

}  // namespace meshtrain
