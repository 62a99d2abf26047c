// src/meshtrain/kernels/cpu/attention.cpp
//
// Causal multi-head self-attention, softmax(q·kᵀ/√d + mask)·v (Vaswani et al. 2017, eq. 1),
// computed one query row at a time so that no T×T matrix is ever stored: forward keeps the
// row's log-sum-exp, backward recomputes the probabilities from it (FlashAttention-2, Dao
// 2023, §3.1 forward and Algorithm 2 backward). Per (sequence, head) the work is O(T²·d) and
// the memory O(T).
//
// Parallel over (sequence, head): each pair reads its own columns of qkv and writes its own
// columns of out/dqkv, so nothing races. A pair first copies its head's K (and V) into
// per-thread scratch, transposed to [head_dim, T]: a score row q·Kᵀ is then head_dim
// vectorised passes over contiguous keys, instead of T dot products of head_dim strided
// floats, and the exp of a whole row is one vectorised loop (vector_math.h). The scratch
// (a few times T·d floats, 8 KiB each at T = 64, d = 32) stays in L1.
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

void check_dims(const AttentionDims& d, const char* what) {
  MT_CHECK(d.batch >= 0 && d.seq_len >= 0 && d.heads > 0 && d.head_dim > 0,
           "{}: bad dims batch={} T={} heads={} head_dim={}", what, d.batch, d.seq_len, d.heads,
           d.head_dim);
}

// The sizes both directions use: C = heads·head_dim features per token, a qkv row is 3·C wide,
// scores are scaled by 1/√head_dim.
struct Layout {
  std::int64_t B, T, H, hd, C, qkv_stride;
  float scale;
  static Layout of(const AttentionDims& d) {
    const std::int64_t C = d.heads * d.head_dim;
    return {d.batch,
            d.seq_len,
            d.heads,
            d.head_dim,
            C,
            3 * C,
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

void attention_forward(const float* qkv, float* out, float* lse, const AttentionDims& dims) {
  check_dims(dims, "attention_forward");
  const auto [B, T, H, hd, C, qkv_stride, scale] = Layout::of(dims);

#pragma omp parallel for collapse(2) schedule(static) if (B * H > 1)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      float* kt = cpu::thread_scratch(static_cast<std::size_t>(T * hd + T));
      float* p = kt + T * hd;
      const float* base = qkv + b * T * qkv_stride;
      const float* v_col = base + 2 * C + h * hd;
      transpose_head(base + C + h * hd, qkv_stride, T, hd, kt);
      for (std::int64_t i = 0; i < T; ++i) {
        score_row(base + i * qkv_stride + h * hd, kt, T, hd, i, scale, p);
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
        for (std::int64_t j = 0; j <= i; ++j) axpy(p[j], v_col + j * qkv_stride, o, hd);
        const float inv_sum = 1.0f / sum;
        for (std::int64_t c = 0; c < hd; ++c) o[c] *= inv_sum;
        lse[(b * H + h) * T + i] = row_max + std::log(sum);
      }
    }
  }
}

void attention_backward(const float* qkv, const float* out, const float* lse, const float* dout,
                        float* dqkv, const AttentionDims& dims) {
  check_dims(dims, "attention_backward");
  const auto [B, T, H, hd, C, qkv_stride, scale] = Layout::of(dims);

  // With P = softmax(S), S = scale·q·kᵀ, O = P·v (FlashAttention-2, Algorithm 2):
  //   dv_j = Σ_i P_ij·dO_i        dP_ij = dO_i·v_j
  //   dS_ij = P_ij·(dP_ij − D_i), D_i = Σ_j P_ij·dP_ij = dO_i·O_i   (softmax Jacobian)
  //   dq_i = scale·Σ_j dS_ij·k_j  dk_j = scale·Σ_i dS_ij·q_i
  // D_i from dO_i·O_i costs O(d) instead of O(T·d), and P_ij = exp(S_ij − lse_i) needs no
  // second max/sum pass. dk and dv gather over query rows, which is why a (sequence, head)
  // pair is never split between threads.
#pragma omp parallel for collapse(2) schedule(static) if (B * H > 1)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      float* kt = cpu::thread_scratch(static_cast<std::size_t>(2 * T * hd + 2 * T));
      float* vt = kt + T * hd;
      float* p = vt + T * hd;
      float* ds = p + T;
      const float* base = qkv + b * T * qkv_stride;
      const float* k_col = base + C + h * hd;
      transpose_head(k_col, qkv_stride, T, hd, kt);
      transpose_head(base + 2 * C + h * hd, qkv_stride, T, hd, vt);
      float* dbase = dqkv + b * T * qkv_stride;
      float* dq_col = dbase + h * hd;
      float* dk_col = dbase + C + h * hd;
      float* dv_col = dbase + 2 * C + h * hd;
      for (std::int64_t j = 0; j < T; ++j) {  // dqkv is overwritten; dk, dv accumulate below
        std::memset(dk_col + j * qkv_stride, 0, static_cast<std::size_t>(hd) * sizeof(float));
        std::memset(dv_col + j * qkv_stride, 0, static_cast<std::size_t>(hd) * sizeof(float));
      }
      const float* lse_row = lse + (b * H + h) * T;
      for (std::int64_t i = 0; i < T; ++i) {
        const float* q = base + i * qkv_stride + h * hd;
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
        float* dq = dq_col + i * qkv_stride;
        for (std::int64_t c = 0; c < hd; ++c) {  // dq_i = Σ_j dS_ij·k_j (scale folded in ds)
          const float* k = kt + c * T;
          float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
          for (std::int64_t j = 0; j <= i; ++j) acc += ds[j] * k[j];
          dq[c] = acc;
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          axpy(p[j], dout_i, dv_col + j * qkv_stride, hd);
          axpy(ds[j], q, dk_col + j * qkv_stride, hd);
        }
      }
    }
  }
}

}  // namespace meshtrain::kernels
