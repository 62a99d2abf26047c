// src/meshtrain/core/dtype.h — element types of a Tensor. Only f32 and i32 have kernels today;
// bf16/f16 are reserved so mixed precision (a later issue) changes no signatures.
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
