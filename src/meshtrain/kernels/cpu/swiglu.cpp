// src/meshtrain/kernels/cpu/swiglu.cpp
//
// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", eq. 5 with Swish_1 = SiLU; the
// Llama MLP's act_fn(gate_proj(x)) · up_proj(x)): out = silu(g)·u, silu(g) = g·σ(g),
// σ(g) = 1 / (1 + e^(−g)). e^(−g) is the vectorisable exp_approx (< 1 ulp, vector_math.h):
// glibc's expf is a scalar call and would keep these loops unvectorised.
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/vector_math.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

void swiglu_forward(const float* gate, const float* up, float* out, std::int64_t n) {
  MT_CHECK(n >= 0, "swiglu_forward: n={}", n);
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float s = 1.0f / (1.0f + cpu::exp_approx(-g));
    out[i] = g * s * up[i];
  }
}

void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, std::int64_t n) {
  MT_CHECK(n >= 0, "swiglu_backward: n={}", n);
  // d silu/dg = σ + g·σ(1 − σ) = σ·(1 + g·(1 − σ)). 1 − σ is formed as e^(−g)·σ, not by
  // subtraction: for g ≫ 0 the subtraction would cancel to an absolute error ε, i.e. a
  // relative error ≈ ε·g·e^g in g·(1 − σ). Everything is read into registers before dgate and
  // dup are written, which is what lets them alias gate and up.
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float u = up[i];
    const float d = dout[i];
    const float e = cpu::exp_approx(-g);
    const float s = 1.0f / (1.0f + e);
    dgate[i] = s * (1.0f + g * (e * s)) * u * d;
    dup[i] = g * s * d;
  }
}

}  // namespace meshtrain::kernels
