// TEMPORARY scalar stand-in (replaced by the tiled kernel on branch cp-kernel).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {
bool visible(AttentionMask m, const AttentionChunkDims& d, std::int64_t i, std::int64_t j) {
  if (m == AttentionMask::full) return true;
  if (m == AttentionMask::skip) return false;
  return d.kv_offset + j <= d.q_offset + i;
}
}  // namespace

void attention_chunk_forward(const QkvRows& in, const AttentionChunkDims& d, AttentionMask mask,
                             float* out, std::int64_t out_stride, float* lse) {
  const std::int64_t group = d.heads / d.kv_heads, hd = d.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> s(static_cast<std::size_t>(d.kv_len));
  for (std::int64_t b = 0; b < d.batch; ++b)
    for (std::int64_t h = 0; h < d.heads; ++h)
      for (std::int64_t i = 0; i < d.q_len; ++i) {
        const float* q = in.q + (b * d.q_seq_rows + i) * in.q_stride + h * hd;
        float* o = out + (b * d.q_seq_rows + i) * out_stride + h * hd;
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          if (!visible(mask, d, i, j)) { s[j] = -std::numeric_limits<float>::infinity(); continue; }
          const float* k = in.k + (b * d.kv_seq_rows + j) * in.kv_stride + (h / group) * hd;
          float acc = 0;
          for (std::int64_t c = 0; c < hd; ++c) acc += q[c] * k[c];
          s[j] = acc * scale;
          m = std::max(m, s[j]);
        }
        std::memset(o, 0, sizeof(float) * hd);
        float* l = lse + (b * d.heads + h) * d.lse_seq_len + i;
        if (m == -std::numeric_limits<float>::infinity()) { *l = m; continue; }
        float sum = 0;
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          if (!visible(mask, d, i, j)) continue;
          const float p = std::exp(s[j] - m);
          sum += p;
          const float* v = in.v + (b * d.kv_seq_rows + j) * in.kv_stride + (h / group) * hd;
          for (std::int64_t c = 0; c < hd; ++c) o[c] += p * v[c];
        }
        for (std::int64_t c = 0; c < hd; ++c) o[c] /= sum;
        *l = m + std::log(sum);
      }
}

void attention_merge(float* out, std::int64_t out_stride, float* lse, const float* part_out,
                     std::int64_t part_stride, const float* part_lse, const AttentionChunkDims& d) {
  const std::int64_t hd = d.head_dim;
  for (std::int64_t b = 0; b < d.batch; ++b)
    for (std::int64_t h = 0; h < d.heads; ++h)
      for (std::int64_t i = 0; i < d.q_len; ++i) {
        float* l = lse + (b * d.heads + h) * d.lse_seq_len + i;
        const float pl = part_lse[(b * d.heads + h) * d.lse_seq_len + i];
        if (pl == -std::numeric_limits<float>::infinity()) continue;
        float* o = out + (b * d.q_seq_rows + i) * out_stride + h * hd;
        const float* po = part_out + (b * d.q_seq_rows + i) * part_stride + h * hd;
        const float m = std::max(*l, pl);
        const float a = std::exp(*l - m), c2 = std::exp(pl - m);
        for (std::int64_t c = 0; c < hd; ++c) o[c] = (a * o[c] + c2 * po[c]) / (a + c2);
        *l = m + std::log(a + c2);
      }
}

void attention_delta(const float* out, const float* dout, std::int64_t stride,
                     const AttentionChunkDims& d, float* delta) {
  for (std::int64_t b = 0; b < d.batch; ++b)
    for (std::int64_t h = 0; h < d.heads; ++h)
      for (std::int64_t i = 0; i < d.q_len; ++i) {
        const float* o = out + (b * d.q_seq_rows + i) * stride + h * d.head_dim;
        const float* g = dout + (b * d.q_seq_rows + i) * stride + h * d.head_dim;
        float acc = 0;
        for (std::int64_t c = 0; c < d.head_dim; ++c) acc += o[c] * g[c];
        delta[(b * d.heads + h) * d.lse_seq_len + i] = acc;
      }
}

void attention_chunk_backward(const QkvRows& in, const float* dout, std::int64_t dout_stride,
                              const float* lse, const float* delta, const QkvGradRows& grad,
                              const AttentionChunkDims& d, AttentionMask mask) {
  const std::int64_t group = d.heads / d.kv_heads, hd = d.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (std::int64_t b = 0; b < d.batch; ++b)
    for (std::int64_t h = 0; h < d.heads; ++h)
      for (std::int64_t i = 0; i < d.q_len; ++i) {
        const std::int64_t li = (b * d.heads + h) * d.lse_seq_len + i;
        if (lse[li] == -std::numeric_limits<float>::infinity()) continue;
        const float* q = in.q + (b * d.q_seq_rows + i) * in.q_stride + h * hd;
        const float* g = dout + (b * d.q_seq_rows + i) * dout_stride + h * hd;
        float* dq = grad.dq + (b * d.q_seq_rows + i) * grad.q_stride + h * hd;
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          if (!visible(mask, d, i, j)) continue;
          const std::int64_t kr = (b * d.kv_seq_rows + j);
          const float* k = in.k + kr * in.kv_stride + (h / group) * hd;
          const float* v = in.v + kr * in.kv_stride + (h / group) * hd;
          float s = 0, dp = 0;
          for (std::int64_t c = 0; c < hd; ++c) { s += q[c] * k[c]; dp += g[c] * v[c]; }
          const float p = std::exp(s * scale - lse[li]);
          const float ds = p * (dp - delta[li]) * scale;
          float* dk = grad.dk + kr * grad.kv_stride + (h / group) * hd;
          float* dv = grad.dv + kr * grad.kv_stride + (h / group) * hd;
          for (std::int64_t c = 0; c < hd; ++c) {
            dq[c] += ds * k[c];
            dk[c] += ds * q[c];
            dv[c] += p * g[c];
          }
        }
      }
}

}  // namespace meshtrain::kernels
