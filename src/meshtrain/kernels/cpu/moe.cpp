// src/meshtrain/kernels/cpu/moe.cpp
//
// The sparse mixture-of-experts pieces of kernels.h: router softmax + top-k + renormalisation
// (Mixtral, Jiang et al. 2024, §2.1, as Hugging Face MixtralSparseMoeBlock computes it), the
// router's backward, and the gather / combine / scatter of token rows around the experts'
// packed buffer. Every loop is over tokens (or packed rows) with each output row written by one
// iteration, so nothing races and the sums run in a fixed order for any thread count.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

// Rows of C floats per OpenMP region worth forking for (the copies are ≈C/16 vector ops each).
bool worth_parallel(std::int64_t rows, std::int64_t C) { return rows * C >= cpu::kParallelGrain; }

// probs[e] = softmax(logits)[e], returns lse. The sum runs in double (as vocab_shard_sum_exp).
float softmax_row(const float* logits, float* probs, std::int64_t E) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t e = 0; e < E; ++e) m = logits[e] > m ? logits[e] : m;
  double sum = 0.0;
  for (std::int64_t e = 0; e < E; ++e) {
    probs[e] = std::exp(logits[e] - m);
    sum += probs[e];
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (std::int64_t e = 0; e < E; ++e) probs[e] *= inv;
  return m + static_cast<float>(std::log(sum));
}

// The k largest of probs[0, E) in decreasing order, ties to the lower index: k passes of a
// strict-greater argmax over the experts not taken yet (E is small: 8–64 in practice).
void top_k_row(const float* probs, std::int64_t E, std::int64_t k, std::int32_t* expert,
               float* weight) {
  double sum = 0.0;
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t best = -1;
    for (std::int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (std::int64_t i = 0; i < j; ++i) taken = taken || expert[i] == e;
      if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
    }
    expert[j] = static_cast<std::int32_t>(best);
    weight[j] = probs[best];
    sum += probs[best];
  }
  // Divided in f32 by the f32 sum, as torch's `routing_weights /= routing_weights.sum(...)`.
  const auto total = static_cast<float>(sum);
  for (std::int64_t j = 0; j < k; ++j) weight[j] /= total;
}

}  // namespace

void moe_router_forward(const float* logits, std::int64_t N, std::int64_t E, std::int64_t k,
                        float* probs, float* lse, std::int32_t* top_expert, float* top_weight) {
  MT_CHECK(N >= 0 && E >= 1 && k >= 1 && k <= E, "moe_router_forward: N={} E={} k={}", N, E, k);
#pragma omp parallel for schedule(static) if (worth_parallel(N, E * k))
  for (std::int64_t n = 0; n < N; ++n) {
    lse[n] = softmax_row(logits + n * E, probs + n * E, E);
    top_k_row(probs + n * E, E, k, top_expert + n * k, top_weight + n * k);
  }
}

void moe_router_backward(const float* probs, const float* lse, const std::int32_t* top_expert,
                         const float* top_weight, const float* d_weight, const float* aux_dprob,
                         float z_scale, float* dlogits, std::int64_t N, std::int64_t E,
                         std::int64_t k) {
  MT_CHECK(N >= 0 && E >= 1 && k >= 1 && k <= E, "moe_router_backward: N={} E={} k={}", N, E, k);
#pragma omp parallel for schedule(static) if (worth_parallel(N, E * k))
  for (std::int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * E;
    float* dl = dlogits + n * E;
    // Load balancing and z-loss act on the full softmax.
    double p_dot_a = 0.0;
    if (aux_dprob != nullptr) {
      for (std::int64_t e = 0; e < E; ++e) p_dot_a += static_cast<double>(p[e]) * aux_dprob[e];
    }
    const float z = z_scale * lse[n];
    for (std::int64_t e = 0; e < E; ++e) {
      const float aux = aux_dprob != nullptr ? aux_dprob[e] - static_cast<float>(p_dot_a) : 0.0f;
      dl[e] = p[e] * (aux + z);
    }
    // The renormalised top-k weights are a softmax over the chosen logits alone.
    const float* w = top_weight + n * k;
    const float* g = d_weight + n * k;
    double w_dot_g = 0.0;
    for (std::int64_t j = 0; j < k; ++j) w_dot_g += static_cast<double>(w[j]) * g[j];
    for (std::int64_t j = 0; j < k; ++j) {
      dl[top_expert[n * k + j]] += w[j] * (g[j] - static_cast<float>(w_dot_g));
    }
  }
}

void moe_gather_rows(const float* x, const std::int32_t* row_token, float* packed,
                     std::int64_t rows, std::int64_t C) {
  MT_CHECK(rows >= 0 && C >= 0, "moe_gather_rows: rows={} C={}", rows, C);
  const auto bytes = static_cast<std::size_t>(C) * sizeof(float);
#pragma omp parallel for schedule(static) if (worth_parallel(rows, C))
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(packed + r * C, x + static_cast<std::int64_t>(row_token[r]) * C, bytes);
  }
}

void moe_combine_forward(const float* packed, const std::int32_t* assign_row, const float* weight,
                         float* y, std::int64_t N, std::int64_t k, std::int64_t C) {
  MT_CHECK(N >= 0 && k >= 1 && C >= 0, "moe_combine_forward: N={} k={} C={}", N, k, C);
#pragma omp parallel for schedule(static) if (worth_parallel(N * k, C))
  for (std::int64_t n = 0; n < N; ++n) {
    float* yn = y + n * C;
    for (std::int64_t c = 0; c < C; ++c) yn[c] = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t r = assign_row[n * k + j];
      if (r < 0) continue;
      const float w = weight[n * k + j];
      const float* src = packed + static_cast<std::int64_t>(r) * C;
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) yn[c] += w * src[c];
    }
  }
}

void moe_combine_backward(const float* dy, const float* packed, const std::int32_t* assign_row,
                          const float* weight, float* d_packed, float* d_weight, std::int64_t N,
                          std::int64_t k, std::int64_t C) {
  MT_CHECK(N >= 0 && k >= 1 && C >= 0, "moe_combine_backward: N={} k={} C={}", N, k, C);
#pragma omp parallel for schedule(static) if (worth_parallel(N * k, C))
  for (std::int64_t n = 0; n < N; ++n) {
    const float* dyn = dy + n * C;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t a = n * k + j;
      const std::int32_t r = assign_row[a];
      if (r < 0) {
        d_weight[a] = 0.0f;
        continue;
      }
      const float w = weight[a];
      const float* out = packed + static_cast<std::int64_t>(r) * C;
      float* dst = d_packed + static_cast<std::int64_t>(r) * C;
      double dot = 0.0;
      for (std::int64_t c = 0; c < C; ++c) {
        dst[c] = w * dyn[c];
        dot += static_cast<double>(dyn[c]) * out[c];
      }
      d_weight[a] = static_cast<float>(dot);
    }
  }
}

void moe_scatter_add_rows(const float* d_packed, const std::int32_t* assign_row, float* dx,
                          std::int64_t N, std::int64_t k, std::int64_t C) {
  MT_CHECK(N >= 0 && k >= 1 && C >= 0, "moe_scatter_add_rows: N={} k={} C={}", N, k, C);
#pragma omp parallel for schedule(static) if (worth_parallel(N * k, C))
  for (std::int64_t n = 0; n < N; ++n) {
    float* dst = dx + n * C;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t r = assign_row[n * k + j];
      if (r < 0) continue;
      const float* src = d_packed + static_cast<std::int64_t>(r) * C;
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace meshtrain::kernels
