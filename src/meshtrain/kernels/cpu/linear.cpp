// src/meshtrain/kernels/cpu/linear.cpp
//
// y = x·Wᵀ + b and its backward (PyTorch nn.Linear, W stored [out, in]) as three GEMMs plus
// the bias terms; the 16-bit forms of mixed precision run the same GEMMs through gemm_16bit.
// Uses: gemm, gemm_16bit (gemm.cpp).
#include <algorithm>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

// y [tokens, out] += b [out] on every row.
void add_bias(float* y, const float* b, std::int64_t tokens, std::int64_t out) {
#pragma omp parallel for schedule(static) if (tokens * out >= cpu::kParallelGrain)
  for (std::int64_t t = 0; t < tokens; ++t) {
    float* row = y + t * out;
    for (std::int64_t j = 0; j < out; ++j) row[j] += b[j];
  }
}

void check_dims(const LinearDims& dims, const char* what) {
  MT_CHECK(dims.tokens >= 0 && dims.in_features >= 0 && dims.out_features >= 0,
           "{}: bad dims {}x{}->{}", what, dims.tokens, dims.in_features, dims.out_features);
}

}  // namespace

void linear_forward(const float* x, const float* w, const float* b, float* y,
                    const LinearDims& dims) {
  const std::int64_t tokens = dims.tokens;
  const std::int64_t out = dims.out_features;
  MT_CHECK(tokens >= 0 && dims.in_features >= 0 && out >= 0, "linear_forward: bad dims {}x{}->{}",
           tokens, dims.in_features, out);
  // x [tokens, in] · (w [out, in])ᵀ: W is read transposed through the GEMM's strides.
  gemm(x, w, y, tokens, out, dims.in_features, /*trans_a=*/false, /*trans_b=*/true, 1.0f, 0.0f);
  if (b != nullptr) add_bias(y, b, tokens, out);
}

void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, const LinearDims& dims) {
  const std::int64_t tokens = dims.tokens;
  const std::int64_t in = dims.in_features;
  const std::int64_t out = dims.out_features;
  MT_CHECK(tokens >= 0 && in >= 0 && out >= 0, "linear_backward: bad dims {}x{}->{}", tokens, in,
           out);
  // dx = dy · W              [tokens, out]·[out, in]
  if (dx != nullptr) gemm(dy, w, dx, tokens, in, out, false, false, 1.0f, 0.0f);
  // dw += dyᵀ · x            [out, tokens]·[tokens, in]; beta = 1 accumulates in place.
  // dw == nullptr is accepted too, so a schedule that splits backward-input from
  // backward-weight (DESIGN invariant 6) can ask for dx alone.
  if (dw != nullptr) gemm(dy, x, dw, out, in, tokens, /*trans_a=*/true, false, 1.0f, 1.0f);
  if (db != nullptr) bias_backward(dy, db, tokens, out);
}

void bias_backward(const float* dy, float* db, std::int64_t tokens, std::int64_t out) {
  // db += Σ_t dy[t, :]. Threads own column ranges rather than rows, so no two threads
  // write the same db entry and every entry sums its tokens in the same order whatever the
  // thread count (a resumed run reproduces bit for bit, DESIGN invariant 8); within a range
  // the rows are read contiguously.
  cpu::for_each_column_range(tokens, out, [&](std::int64_t j0, std::int64_t width) {
    float* acc = cpu::thread_scratch(static_cast<std::size_t>(width));
    std::fill_n(acc, width, 0.0f);
    for (std::int64_t t = 0; t < tokens; ++t) {
      const float* row = dy + t * out + j0;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) acc[j] += row[j];
    }
    for (std::int64_t j = 0; j < width; ++j) db[j0 + j] += acc[j];
  });
}

void linear_forward_16bit(const std::uint16_t* x, const std::uint16_t* w, const float* b, float* y,
                          const LinearDims& dims, DType dtype) {
  check_dims(dims, "linear_forward_16bit");
  gemm_16bit(x, w, y, dims.tokens, dims.out_features, dims.in_features, /*trans_a=*/false,
             /*trans_b=*/true, 1.0f, 0.0f, dtype);
  if (b != nullptr) add_bias(y, b, dims.tokens, dims.out_features);
}

void linear_backward_16bit(const std::uint16_t* x, const std::uint16_t* w, const std::uint16_t* dy,
                           float* dx, float* dw, const LinearDims& dims, DType dtype) {
  check_dims(dims, "linear_backward_16bit");
  const std::int64_t tokens = dims.tokens, in = dims.in_features, out = dims.out_features;
  if (dx != nullptr) gemm_16bit(dy, w, dx, tokens, in, out, false, false, 1.0f, 0.0f, dtype);
  if (dw != nullptr) {
    gemm_16bit(dy, x, dw, out, in, tokens, /*trans_a=*/true, false, 1.0f, 1.0f, dtype);
  }
}

}  // namespace meshtrain::kernels
