// src/meshtrain/core/tensor.h
//
// Tensor: a contiguous, row-major block of elements from the tracked allocator, with a shape
// and a dtype. Copies share storage (like torch.Tensor); clone() copies data. Views made by
// reshape() and rows() share storage too. No autograd: layers write their backward by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/dtype.h"

namespace meshtrain {

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
std::string to_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  /// Uninitialised tensor of `shape` (elements ≥ 0 each), counted under `category`.
  static Tensor empty(Shape shape, MemCategory category, DType dtype = DType::f32);
  /// Zero-filled tensor.
  static Tensor zeros(Shape shape, MemCategory category, DType dtype = DType::f32);
  /// A tensor over memory the allocator did not hand out: `data` (64-byte aligned, room for
  /// the shape's elements of `dtype`), kept alive by `owner` until the last view goes, and
  /// counted under `category` meanwhile (e.g. a bucket in a shared-memory window).
  static Tensor external(void* data, Shape shape, MemCategory category,
                         std::shared_ptr<void> owner, DType dtype = DType::f32);

  bool defined() const noexcept { return storage_ != nullptr; }
  const Shape& shape() const noexcept { return shape_; }
  int ndim() const noexcept { return static_cast<int>(shape_.size()); }
  /// Size of dimension `d`; negative d counts from the end (-1 = last).
  std::int64_t dim(int d) const;
  std::int64_t numel() const noexcept { return numel_; }
  std::int64_t bytes() const noexcept {
    return numel_ * static_cast<std::int64_t>(dtype_size(dtype_));
  }
  DType dtype() const noexcept { return dtype_; }
  MemCategory category() const noexcept;

  /// Typed element access; MT_CHECKs the dtype (f32() needs DType::f32, i32() DType::i32,
  /// u16() DType::bf16 or DType::f16: the elements' bit patterns, see core/half.h).
  float* f32();
  const float* f32() const;
  std::int32_t* i32();
  const std::int32_t* i32() const;
  std::uint16_t* u16();
  const std::uint16_t* u16() const;
  std::span<float> span_f32() { return {f32(), static_cast<std::size_t>(numel_)}; }
  std::span<const float> span_f32() const { return {f32(), static_cast<std::size_t>(numel_)}; }
  /// The elements' storage as bytes() bytes, whatever the dtype. MT_CHECKs a defined tensor.
  std::span<std::byte> span_bytes() {
    return {static_cast<std::byte*>(raw()), static_cast<std::size_t>(bytes())};
  }

  /// Same storage, new shape with the same number of elements.
  Tensor reshape(Shape shape) const;
  /// Rows [begin, end) of dimension 0, sharing storage.
  Tensor rows(std::int64_t begin, std::int64_t end) const;
  /// A new tensor (same category unless given) holding a copy of the elements.
  Tensor clone() const;
  Tensor clone(MemCategory category) const;
  /// A new tensor of the same shape holding the elements converted to `dtype`, counted under
  /// `category`. Converts among f32, bf16 and f16 (MT_CHECKed) as core/half.h describes:
  /// to 16 bits rounds to nearest even, to f32 is exact; the same dtype is a copy (clone).
  Tensor to(DType dtype, MemCategory category) const;

  void fill(float value);
  void zero();
  /// Copies elements from `other` (same numel and dtype).
  void copy_from(const Tensor& other);

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  std::int64_t numel_ = 0;
  std::int64_t offset_ = 0;  // elements from the start of storage
  DType dtype_ = DType::f32;

  void* raw() const;
};

}  // namespace meshtrain
