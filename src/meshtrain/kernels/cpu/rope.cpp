// src/meshtrain/kernels/cpu/rope.cpp
//
// Rotary position embedding (Su et al. 2021, "RoFormer", §3.4.2, eq. 34) in the Hugging Face
// Llama layout (LlamaRotaryEmbedding + apply_rotary_pos_emb, "rotate_half"): within a head,
// element i < d/2 pairs with i + d/2 and, with a = pos·θ^(−2i/d),
//   x_i       ← x_i·cos a − x_{i+d/2}·sin a
//   x_{i+d/2} ← x_{i+d/2}·cos a + x_i·sin a
// The angle is computed in float32 the way Hugging Face does, so that a model trained here and
// loaded there (or the reverse) sees the same rotation up to the last-ulp differences of the
// libm/SLEEF powf, cosf and sinf:
//   inv_freq_i = 1 / θ^(fl(2i) / d)   (torch: 1.0 / (base ** (arange(0, d, 2).float() / d)))
//   a          = fl(pos) · inv_freq_i (torch: inv_freq @ position_ids.float(), one product)
//   cos a, sin a of that float32 a    (torch: emb.cos(), emb.sin())
// At pos ≈ 4096 the float32 product already differs from the exact angle by up to ≈ 2e-4 rad:
// an angle computed in double would be closer to the paper and that far from the reference.
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

void rope_apply(float* x, std::int64_t stride, const std::int32_t* positions, std::int64_t rows,
                std::int64_t heads, std::int64_t head_dim, float theta, bool inverse) {
  MT_CHECK(rows >= 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0 &&
               stride >= heads * head_dim && theta > 0.0f,
           "rope_apply: bad dims rows={} heads={} head_dim={} (even) stride={} theta={}", rows,
           heads, head_dim, stride, theta);
  const std::int64_t half = head_dim / 2;
  const float d = static_cast<float>(head_dim);
  // The rotation by −a is the transpose of the rotation by a: sin(−a) = −sin a exactly
  // (cosf/sinf are odd/even to the bit), so backward flips the sign of sin only.
  const float sin_sign = inverse ? -1.0f : 1.0f;

#pragma omp parallel if (rows * heads * head_dim >= cpu::kParallelGrain)
  {
    // Per thread: inv_freq once, then cos/sin once per row, shared by all heads of the row
    // (cosf/sinf cost more than the rotation itself).
    float* inv_freq = cpu::thread_scratch(static_cast<std::size_t>(3 * half));
    float* cos_a = inv_freq + half;
    float* sin_a = cos_a + half;
    for (std::int64_t i = 0; i < half; ++i) {
      inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / d);
    }
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float pos = static_cast<float>(positions[r]);
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = pos * inv_freq[i];
        cos_a[i] = std::cos(a);
        sin_a[i] = sin_sign * std::sin(a);
      }
      for (std::int64_t h = 0; h < heads; ++h) {
        float* lo = x + r * stride + h * head_dim;
        float* hi = lo + half;
#pragma omp simd
        for (std::int64_t i = 0; i < half; ++i) {
          const float x1 = lo[i];
          const float x2 = hi[i];
          // Hugging Face: q·cos + rotate_half(q)·sin with rotate_half(q) = [−x2, x1].
          lo[i] = x1 * cos_a[i] + (-x2) * sin_a[i];
          hi[i] = x2 * cos_a[i] + x1 * sin_a[i];
        }
      }
    }
  }
}

}  // namespace meshtrain::kernels
