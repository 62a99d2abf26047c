// src/meshtrain/core/dtype.h — element types of a Tensor. bf16 and f16 hold the low-precision
// parameters and saved activations of mixed precision (core/half.h, docs/mixed_precision.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace meshtrain {

enum class DType : std::uint8_t { f32, bf16, f16, i32 };

constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
  }
  return 0;
}

constexpr std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
  }
  return "unknown";
}

}  // namespace meshtrain
