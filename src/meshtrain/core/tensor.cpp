#include "meshtrain/core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/core/half.h"

namespace meshtrain {

struct Tensor::Storage {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  MemCategory category = MemCategory::other;
  std::shared_ptr<void> owner;  // set: external memory (Tensor::external), only counted
  Storage(std::size_t n, MemCategory c)
      : ptr(TrackedAllocator::instance().allocate(n, c)), bytes(n), category(c) {}
  Storage(void* data, std::size_t n, MemCategory c, std::shared_ptr<void> keep)
      : ptr(data), bytes(n), category(c), owner(std::move(keep)) {
    TrackedAllocator::instance().account(static_cast<std::int64_t>(n), c);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (owner) {
      TrackedAllocator::instance().account(-static_cast<std::int64_t>(bytes), category);
    } else {
      TrackedAllocator::instance().release(ptr, bytes, category);
    }
  }
};

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string to_string(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Tensor Tensor::empty(Shape shape, MemCategory category, DType dtype) {
  for (std::int64_t d : shape) MT_CHECK(d >= 0, "negative dimension in shape {}", to_string(shape));
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ =
      std::make_shared<Storage>(static_cast<std::size_t>(t.numel_) * dtype_size(dtype), category);
  return t;
}

Tensor Tensor::external(void* data, Shape shape, MemCategory category, std::shared_ptr<void> owner,
                        DType dtype) {
  for (std::int64_t d : shape) MT_CHECK(d >= 0, "negative dimension in shape {}", to_string(shape));
  MT_CHECK(data != nullptr && owner != nullptr, "Tensor::external needs memory and its owner");
  MT_CHECK(reinterpret_cast<std::uintptr_t>(data) % 64 == 0, "Tensor::external: unaligned data");
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(
      data, static_cast<std::size_t>(t.numel_) * dtype_size(dtype), category, std::move(owner));
  return t;
}

Tensor Tensor::zeros(Shape shape, MemCategory category, DType dtype) {
  Tensor t = empty(std::move(shape), category, dtype);
  t.zero();
  return t;
}

std::int64_t Tensor::dim(int d) const {
  const int n = ndim();
  const int i = d < 0 ? d + n : d;
  MT_CHECK(i >= 0 && i < n, "dim {} out of range for shape {}", d, to_string(shape_));
  return shape_[static_cast<std::size_t>(i)];
}

MemCategory Tensor::category() const noexcept {
  return storage_ ? storage_->category : MemCategory::other;
}

void* Tensor::raw() const {
  MT_CHECK(storage_ != nullptr, "use of an undefined tensor");
  return static_cast<char*>(storage_->ptr) + static_cast<std::size_t>(offset_) * dtype_size(dtype_);
}

float* Tensor::f32() {
  MT_CHECK(dtype_ == DType::f32, "tensor is {}, not f32", to_string(dtype_));
  return static_cast<float*>(raw());
}
const float* Tensor::f32() const {
  MT_CHECK(dtype_ == DType::f32, "tensor is {}, not f32", to_string(dtype_));
  return static_cast<const float*>(raw());
}
std::int32_t* Tensor::i32() {
  MT_CHECK(dtype_ == DType::i32, "tensor is {}, not i32", to_string(dtype_));
  return static_cast<std::int32_t*>(raw());
}
const std::int32_t* Tensor::i32() const {
  MT_CHECK(dtype_ == DType::i32, "tensor is {}, not i32", to_string(dtype_));
  return static_cast<const std::int32_t*>(raw());
}

std::uint16_t* Tensor::u16() {
  MT_CHECK(is_16bit_float(dtype_), "tensor is {}, not bf16 or f16", to_string(dtype_));
  return static_cast<std::uint16_t*>(raw());
}
const std::uint16_t* Tensor::u16() const {
  MT_CHECK(is_16bit_float(dtype_), "tensor is {}, not bf16 or f16", to_string(dtype_));
  return static_cast<const std::uint16_t*>(raw());
}

Tensor Tensor::reshape(Shape shape) const {
  MT_CHECK(shape_numel(shape) == numel_, "cannot reshape {} to {}", to_string(shape_),
           to_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
  MT_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
           "rows [{}, {}) out of range for shape {}", begin, end, to_string(shape_));
  const std::int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.numel_ = (end - begin) * row;
  t.offset_ = offset_ + begin * row;
  return t;
}

Tensor Tensor::clone() const { return clone(category()); }

Tensor Tensor::clone(MemCategory category) const {
  Tensor t = empty(shape_, category, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype, MemCategory category) const {
  const auto is_float = [](DType d) { return d == DType::f32 || is_16bit_float(d); };
  MT_CHECK(is_float(dtype_) && is_float(dtype), "no conversion from {} to {}", to_string(dtype_),
           to_string(dtype));
  if (dtype == dtype_) return clone(category);
  Tensor t = empty(shape_, category, dtype);
  if (dtype == DType::f32) {
    cast_16bit_to_f32(u16(), t.f32(), numel_, dtype_);
  } else if (dtype_ == DType::f32) {
    cast_f32_to_16bit(f32(), t.u16(), numel_, dtype);
  } else {
    // bf16 ↔ f16 through f32, which holds both exactly: one rounding, as a direct conversion.
    const Tensor wide = to(DType::f32, MemCategory::other);
    cast_f32_to_16bit(wide.f32(), t.u16(), numel_, dtype);
  }
  return t;
}

void Tensor::fill(float value) {
  float* p = f32();
  for (std::int64_t i = 0; i < numel_; ++i) p[i] = value;
}

void Tensor::zero() {
  if (numel_ > 0) std::memset(raw(), 0, static_cast<std::size_t>(bytes()));
}

void Tensor::copy_from(const Tensor& other) {
  MT_CHECK(other.numel_ == numel_ && other.dtype_ == dtype_, "copy {} {} into {} {}",
           to_string(other.dtype_), to_string(other.shape_), to_string(dtype_), to_string(shape_));
  if (numel_ > 0) std::memcpy(raw(), other.raw(), static_cast<std::size_t>(bytes()));
}

}  // namespace meshtrain
