// src/meshtrain/kernels/cpu/attention.cpp
//
// Causal grouped-query self-attention, softmax(q·kᵀ/√d + mask)·v (Vaswani et al. 2017, eq. 1;
// grouped-query heads as Ainslie et al. 2023, §2.2: query head h reads kv head h / group),
// computed one query row at a time so that no T×T matrix is ever stored: forward keeps the
// row's log-sum-exp, backward recomputes the probabilities from it (FlashAttention-2, Dao
// 2023, §3.1 forward and Algorithm 2 backward). Per (sequence, head) the work is O(T²·d) and
// the memory O(T). GPT-2's fused c_attn output is the case kv_heads = heads with q, k, v the
// column ranges [0, C), [C, 2C), [2C, 3C) of one 3C-wide row.
//
// Forward is parallel over (sequence, query head): each pair writes its own columns of out
// and its own lse row. Backward is parallel over (sequence, kv head): dk and dv of a kv head
// gather over all query heads of its group, so the group's query heads run inside one task,
// in order; nothing races and every sum has a fixed order whatever the thread count.
// A task first copies its kv head's K (and V) into per-thread scratch, transposed to
// [head_dim, T]: a score row q·Kᵀ is then head_dim vectorised passes over contiguous keys,
// instead of T dot products of head_dim strided floats, and the exp of a whole row is one
// vectorised loop (vector_math.h). The scratch (a few times T·d floats, 8 KiB each at T = 64,
// d = 32) stays in L1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/vector_math.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

void check_dims(const GqaDims& d, std::int64_t q_stride, std::int64_t kv_stride, const char* what) {
  MT_CHECK(d.batch >= 0 && d.seq_len >= 0 && d.heads > 0 && d.kv_heads > 0 && d.head_dim > 0 &&
               d.heads % d.kv_heads == 0,
           "{}: bad dims batch={} T={} heads={} kv_heads={} head_dim={}", what, d.batch, d.seq_len,
           d.heads, d.kv_heads, d.head_dim);
  MT_CHECK(q_stride >= d.heads * d.head_dim && kv_stride >= d.kv_heads * d.head_dim,
           "{}: row strides q={} kv={} narrower than heads·head_dim={} / kv_heads·head_dim={}",
           what, q_stride, kv_stride, d.heads * d.head_dim, d.kv_heads * d.head_dim);
}

// The sizes both directions use: C = heads·head_dim features per token of out/dout, a kv head
// serves `group` query heads, scores are scaled by 1/√head_dim.
struct Layout {
  std::int64_t B, T, H, KV, group, hd, C;
  float scale;
  static Layout of(const GqaDims& d) {
    return {d.batch,
            d.seq_len,
            d.heads,
            d.kv_heads,
            d.heads / d.kv_heads,
            d.head_dim,
            d.heads * d.head_dim,
            1.0f / std::sqrt(static_cast<float>(d.head_dim))};
  }
};

// dst [hd, T] = transpose of the T rows of `col` (row stride `stride`, hd floats each).
void transpose_head(const float* col, std::int64_t stride, std::int64_t T, std::int64_t hd,
                    float* dst) {
  for (std::int64_t j = 0; j < T; ++j) {
    for (std::int64_t c = 0; c < hd; ++c) dst[c * T + j] = col[j * stride + c];
  }
}

// s[j] = scale · q·k_j for j ≤ i, with kt = Kᵀ [hd, T]; vectorised over j.
void score_row(const float* q, const float* kt, std::int64_t T, std::int64_t hd, std::int64_t i,
               float scale, float* s) {
  for (std::int64_t j = 0; j <= i; ++j) s[j] = 0.0f;
  for (std::int64_t c = 0; c < hd; ++c) {
    const float qc = scale * q[c];
    const float* k = kt + c * T;
#pragma omp simd
    for (std::int64_t j = 0; j <= i; ++j) s[j] += qc * k[j];
  }
}

// y[0..n) += alpha · x[0..n)
inline void axpy(float alpha, const float* __restrict x, float* __restrict y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t c = 0; c < n; ++c) y[c] += alpha * x[c];
}

}  // namespace

void gqa_attention_forward(const QkvRows& in, float* out, float* lse, const GqaDims& dims) {
  check_dims(dims, in.q_stride, in.kv_stride, "gqa_attention_forward");
  const auto [B, T, H, KV, group, hd, C, scale] = Layout::of(dims);
  const std::int64_t qs = in.q_stride;
  const std::int64_t kvs = in.kv_stride;

  // Query heads of one group each transpose the same K: T·d copies against O(T²·d) work, and
  // it keeps B·H tasks for the threads instead of B·kv_heads.
#pragma omp parallel for collapse(2) schedule(static) if (B * H > 1)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      float* kt = cpu::thread_scratch(static_cast<std::size_t>(T * hd + T));
      float* p = kt + T * hd;
      const std::int64_t kvh = h / group;
      const float* q_col = in.q + b * T * qs + h * hd;
      const float* v_col = in.v + b * T * kvs + kvh * hd;
      transpose_head(in.k + b * T * kvs + kvh * hd, kvs, T, hd, kt);
      for (std::int64_t i = 0; i < T; ++i) {
        score_row(q_col + i * qs, kt, T, hd, i, scale, p);
        // Causal: query i sees keys 0..i. Subtracting the row max before exp keeps every
        // exponent ≤ 0 (no overflow); lse = max + log Σ exp(s − max) is exact either way.
        float row_max = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) row_max = std::max(row_max, p[j]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (std::int64_t j = 0; j <= i; ++j) {
          p[j] = cpu::exp_approx(p[j] - row_max);
          sum += p[j];
        }
        float* o = out + (b * T + i) * C + h * hd;
        std::memset(o, 0, static_cast<std::size_t>(hd) * sizeof(float));
        for (std::int64_t j = 0; j <= i; ++j) axpy(p[j], v_col + j * kvs, o, hd);
        const float inv_sum = 1.0f / sum;
        for (std::int64_t c = 0; c < hd; ++c) o[c] *= inv_sum;
        lse[(b * H + h) * T + i] = row_max + std::log(sum);
      }
    }
  }
}

void gqa_attention_backward(const QkvRows& in, const float* out, const float* lse,
                            const float* dout, const QkvGradRows& grad, const GqaDims& dims) {
  check_dims(dims, in.q_stride, in.kv_stride, "gqa_attention_backward");
  check_dims(dims, grad.q_stride, grad.kv_stride, "gqa_attention_backward (gradients)");
  const auto [B, T, H, KV, group, hd, C, scale] = Layout::of(dims);
  const std::int64_t qs = in.q_stride;
  const std::int64_t kvs = in.kv_stride;
  const std::int64_t dqs = grad.q_stride;
  const std::int64_t dkvs = grad.kv_stride;

  // With P = softmax(S), S = scale·q·kᵀ, O = P·v (FlashAttention-2, Algorithm 2):
  //   dv_j = Σ_i P_ij·dO_i        dP_ij = dO_i·v_j
  //   dS_ij = P_ij·(dP_ij − D_i), D_i = Σ_j P_ij·dP_ij = dO_i·O_i   (softmax Jacobian)
  //   dq_i = scale·Σ_j dS_ij·k_j  dk_j = scale·Σ_i dS_ij·q_i
  // D_i from dO_i·O_i costs O(d) instead of O(T·d), and P_ij = exp(S_ij − lse_i) needs no
  // second max/sum pass. With grouped heads, dk_j and dv_j also sum over the group's query
  // heads (in head order, then row order).
#pragma omp parallel for collapse(2) schedule(static) if (B * KV > 1)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t kvh = 0; kvh < KV; ++kvh) {
      float* kt = cpu::thread_scratch(static_cast<std::size_t>(2 * T * hd + 2 * T));
      float* vt = kt + T * hd;
      float* p = vt + T * hd;
      float* ds = p + T;
      transpose_head(in.k + b * T * kvs + kvh * hd, kvs, T, hd, kt);
      transpose_head(in.v + b * T * kvs + kvh * hd, kvs, T, hd, vt);
      float* dk_col = grad.dk + b * T * dkvs + kvh * hd;
      float* dv_col = grad.dv + b * T * dkvs + kvh * hd;
      for (std::int64_t j = 0; j < T; ++j) {  // dk, dv are overwritten; they accumulate below
        std::memset(dk_col + j * dkvs, 0, static_cast<std::size_t>(hd) * sizeof(float));
        std::memset(dv_col + j * dkvs, 0, static_cast<std::size_t>(hd) * sizeof(float));
      }
      for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* q_col = in.q + b * T * qs + h * hd;
        float* dq_col = grad.dq + b * T * dqs + h * hd;
        const float* lse_row = lse + (b * H + h) * T;
        for (std::int64_t i = 0; i < T; ++i) {
          const float* q = q_col + i * qs;
          const float* o = out + (b * T + i) * C + h * hd;
          const float* dout_i = dout + (b * T + i) * C + h * hd;
          float d_i = 0.0f;
          for (std::int64_t c = 0; c < hd; ++c) d_i += dout_i[c] * o[c];
          score_row(q, kt, T, hd, i, scale, p);
          const float lse_i = lse_row[i];
#pragma omp simd
          for (std::int64_t j = 0; j <= i; ++j) p[j] = cpu::exp_approx(p[j] - lse_i);
          score_row(dout_i, vt, T, hd, i, 1.0f, ds);  // dP_ij = dO_i·v_j
#pragma omp simd
          for (std::int64_t j = 0; j <= i; ++j) ds[j] = p[j] * (ds[j] - d_i) * scale;
          float* dq = dq_col + i * dqs;
          for (std::int64_t c = 0; c < hd; ++c) {  // dq_i = Σ_j dS_ij·k_j (scale folded in ds)
            const float* k = kt + c * T;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (std::int64_t j = 0; j <= i; ++j) acc += ds[j] * k[j];
            dq[c] = acc;
          }
          for (std::int64_t j = 0; j <= i; ++j) {
            axpy(p[j], dout_i, dv_col + j * dkvs, hd);
            axpy(ds[j], q, dk_col + j * dkvs, hd);
          }
        }
      }
    }
  }
}

}  // namespace meshtrain::kernels
