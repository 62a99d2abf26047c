// src/meshtrain/kernels/cpu/attention.cpp
//
// Causal multi-head self-attention, softmax(q·kᵀ/√d + mask)·v (Vaswani et al. 2017, eq. 1),
// computed one query row at a time so that no T×T matrix is ever stored: forward keeps the
// row's log-sum-exp, backward recomputes the probabilities from it (FlashAttention-2, Dao
// 2023, §3.1 forward and Algorithm 2 backward). Per (sequence, head) the work is O(T²·d) and
// the memory O(T).
//
// Parallel over (sequence, head): each pair reads its own columns of qkv and writes its own
// columns of out/dqkv, so nothing races, and one head's K and V (T·d floats each, 8 KiB at
// T = 64, d = 32) stay in L1 while every query row of that head passes over them. The main
// job has batch·heads ≫ threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

inline float dot(const float* __restrict a, const float* __restrict b, std::int64_t n) {
  float s = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += alpha·x
inline void axpy(float alpha, const float* __restrict x, float* __restrict y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void check_dims(const AttentionDims& d, const char* what) {
  MT_CHECK(d.batch >= 0 && d.seq_len >= 0 && d.heads > 0 && d.head_dim > 0,
           "{}: bad dims batch={} T={} heads={} head_dim={}", what, d.batch, d.seq_len, d.heads,
           d.head_dim);
}

}  // namespace

void attention_forward(const float* qkv, float* out, float* lse, const AttentionDims& dims) {
  check_dims(dims, "attention_forward");
  const std::int64_t B = dims.batch;
  const std::int64_t T = dims.seq_len;
  const std::int64_t H = dims.heads;
  const std::int64_t hd = dims.head_dim;
  const std::int64_t C = H * hd;
  const std::int64_t qkv_stride = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

#pragma omp parallel for collapse(2) schedule(static) if (B * H > 1)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      float* p = cpu::thread_scratch(static_cast<std::size_t>(T));
      const float* base = qkv + b * T * qkv_stride;
      const float* k_col = base + C + h * hd;
      const float* v_col = base + 2 * C + h * hd;
      for (std::int64_t i = 0; i < T; ++i) {
        const float* q = base + i * qkv_stride + h * hd;
        // Causal: query i sees keys 0..i. Subtracting the row max before exp keeps every
        // exponent ≤ 0 (no overflow); lse = max + log Σ exp(s − max) is exact either way.
        float row_max = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {
          p[j] = scale * dot(q, k_col + j * qkv_stride, hd);
          row_max = std::max(row_max, p[j]);
        }
        float sum = 0.0f;
        for (std::int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - row_max);
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
  const std::int64_t B = dims.batch;
  const std::int64_t T = dims.seq_len;
  const std::int64_t H = dims.heads;
  const std::int64_t hd = dims.head_dim;
  const std::int64_t C = H * hd;
  const std::int64_t qkv_stride = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

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
      const float* base = qkv + b * T * qkv_stride;
      const float* k_col = base + C + h * hd;
      const float* v_col = base + 2 * C + h * hd;
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
        float* dq = dq_col + i * qkv_stride;
        std::memset(dq, 0, static_cast<std::size_t>(hd) * sizeof(float));
        const float d_i = dot(dout_i, o, hd);
        const float lse_i = lse_row[i];
        for (std::int64_t j = 0; j <= i; ++j) {
          const float* k = k_col + j * qkv_stride;
          const float* v = v_col + j * qkv_stride;
          const float p = std::exp(scale * dot(q, k, hd) - lse_i);
          const float dp = dot(dout_i, v, hd);
          const float ds = p * (dp - d_i) * scale;  // scale folded in: dS_ij·scale
          axpy(p, dout_i, dv_col + j * qkv_stride, hd);
          axpy(ds, q, dk_col + j * qkv_stride, hd);
          axpy(ds, k, dq, hd);
        }
      }
    }
  }
}

}  // namespace meshtrain::kernels
