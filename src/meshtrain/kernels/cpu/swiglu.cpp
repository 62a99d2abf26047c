// src/meshtrain/kernels/cpu/swiglu.cpp
//
// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", eq. 5 with Swish_1 = SiLU; the
// Llama MLP's act_fn(gate_proj(x)) · up_proj(x)): out = silu(g)·u, silu(g) = g·σ(g),
// σ(g) = 1 / (1 + e^(−g)). e^(−g) is cpu::exp_approx_vec (exp_approx's bits, < 1 ulp;
// vector_math.h), on native vectors (vec.h's parallel_vectors, the tail in one partial vector, so
// every element gets the same operations): glibc's expf is a scalar call, and the loop vectoriser's
// rendering of the scalar exp_approx branches three ways on its clamp.
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/vec.h"
#include "meshtrain/kernels/cpu/vector_math.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

namespace {
using cpu::load_lanes;
using cpu::store_lanes;
using V = cpu::FloatVec<cpu::kLanes>;
}  // namespace

void swiglu_forward(const float* gate, const float* up, float* out, std::int64_t n) {
  MT_CHECK(n >= 0, "swiglu_forward: n={}", n);
  cpu::parallel_vectors(n, [=](std::int64_t i, std::int64_t c) {
    const V g = load_lanes(gate + i, c);
    const V s = 1.0f / (1.0f + cpu::exp_approx_vec(-g));
    store_lanes(out + i, g * s * load_lanes(up + i, c), c);
  });
}

void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, std::int64_t n) {
  MT_CHECK(n >= 0, "swiglu_backward: n={}", n);
  // d silu/dg = σ + g·σ(1 − σ) = σ·(1 + g·(1 − σ)). 1 − σ is formed as e^(−g)·σ, not by
  // subtraction: for g ≫ 0 the subtraction would cancel to an absolute error ε, i.e. a
  // relative error ≈ ε·g·e^g in g·(1 − σ). Each vector is read into registers before dgate
  // and dup are written, which is what lets them alias gate and up.
  cpu::parallel_vectors(n, [=](std::int64_t i, std::int64_t c) {
    const V g = load_lanes(gate + i, c);
    const V u = load_lanes(up + i, c);
    const V d = load_lanes(dout + i, c);
    const V e = cpu::exp_approx_vec(-g);
    const V s = 1.0f / (1.0f + e);
    store_lanes(dgate + i, s * (1.0f + g * (e * s)) * u * d, c);
    store_lanes(dup + i, g * s * d, c);
  });
}

}  // namespace meshtrain::kernels
