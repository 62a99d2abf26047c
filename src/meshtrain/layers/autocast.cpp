#include "meshtrain/layers/autocast.h"

#include "meshtrain/core/error.h"
#include "meshtrain/core/half.h"

namespace meshtrain {

DType attention_operands(const Parameter& qkv_weight) {
  return qkv_weight.value.dtype() == DType::bf16 ? DType::bf16 : DType::f32;
}

Tensor value_f32(const Parameter& p) {
  if (p.value.dtype() == DType::f32) return p.value;
  return p.value.to(DType::f32, MemCategory::activations);
}

Tensor matmul_input(const Tensor& x, const Parameter& weight) {
  const DType dtype = weight.value.dtype();
  if (dtype == DType::f32) return x;
  MT_CHECK(is_16bit_float(dtype), "{}: no matrix product with a {} weight", weight.name,
           to_string(dtype));
  return x.to(dtype, MemCategory::activations);
}

void autocast_linear_forward(const Tensor& x, const Parameter& weight, const Parameter* bias,
                             Tensor& y) {
  const Tensor& w = weight.value;
  MT_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1) && y.ndim() == 2 &&
               y.dim(0) == x.dim(0) && y.dim(1) == w.dim(0),
           "{}: x {} · Wᵀ {} into y {}", weight.name, to_string(x.shape()), to_string(w.shape()),
           to_string(y.shape()));
  MT_CHECK(x.dtype() == w.dtype(), "{}: input is {}, weight {} (use matmul_input)", weight.name,
           to_string(x.dtype()), to_string(w.dtype()));
  const Tensor b = bias != nullptr ? value_f32(*bias) : Tensor();
  const kernels::LinearDims dims{x.dim(0), x.dim(1), w.dim(0)};
  const float* b_ptr = b.defined() ? b.f32() : nullptr;
  if (w.dtype() == DType::f32) {
    kernels::linear_forward(x.f32(), w.f32(), b_ptr, y.f32(), dims);
  } else {
    kernels::linear_forward_16bit(x.u16(), w.u16(), b_ptr, y.f32(), dims, w.dtype());
  }
}

void embedding_lookup(const std::int32_t* ids, const Tensor& table, std::int64_t first,
                      std::int64_t table_rows, float* out, std::int64_t rows) {
  const std::int64_t C = table.dim(1);
  if (table.dtype() == DType::f32) {
    kernels::embedding_shard_forward(ids, table.f32(), first, table_rows, out, rows, C);
  } else {
    kernels::embedding_shard_forward_16bit(ids, table.u16(), table.dtype(), first, table_rows, out,
                                           rows, C);
  }
}

}  // namespace meshtrain
