// tests/unit/kernels/flash_attention_test.cpp
//
// Tests of the chunk-pair attention kernels (kernels.h: attention_chunk_forward / _backward,
// attention_merge, attention_delta; kernels/cpu/flash_attention*.cpp):
//   - the full causal sequence against today's gqa_attention_forward/backward (the reference
//     kernel), T not a multiple of the 64-row blocks, GQA ratios 1, 2, 4, GPT-2's fused qkv;
//   - every mask kind with global offsets against a scalar double-precision reference written
//     here (partly, wholly and not visible pairs), padding columns and rows untouched;
//   - ring-attention style chunking: per-pair forward + attention_merge equals one call, and
//     per-pair backward from the final lse and delta sums to the one-call backward;
//   - central differences (of the double reference, and of the kernel's own f32 forward);
//   - bitwise equality with 1 and 2 threads (and of the fused and two-pass backward); that an
//     off-by-one mask fails the tolerances;
//   - the causal skipping of tile products (flash_tile.h, Causal): every kind and diagonal
//     gives the full product's bits where the mask leaves an element, and skips work;
//   - MT_CHECK deaths on bad dims and strides.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support/bitwise.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/cpu/flash_tile.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

constexpr std::uint64_t kSeed = 4321;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::size_t zu(std::int64_t i) { return static_cast<std::size_t>(i); }

std::vector<float> randn(std::size_t n, std::string_view name) {
  std::vector<float> v(n);
  fill_normal(v, kSeed, stream_of(name), 0, 0.0f, 1.0f);
  return v;
}

/// max over elements of |actual − expected| / (atol + rtol·|expected|); equal infinities count
/// as equal, NaN as +inf.
double worst_ratio(std::span<const float> actual, std::span<const double> expected, double rtol,
                   double atol) {
  double worst = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (a == e) continue;  // also −inf == −inf
    const double ratio = std::abs(a - e) / (atol + rtol * std::abs(e));
    worst = std::isnan(ratio) ? kInf : std::max(worst, ratio);
  }
  return worst;
}

void expect_near(std::span<const float> actual, std::span<const double> expected, double rtol,
                 double atol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  EXPECT_LE(worst_ratio(actual, expected, rtol, atol), 1.0)
      << what << " (rtol " << rtol << ", atol " << atol << ")";
}

std::vector<double> to_double(std::span<const float> v) { return {v.begin(), v.end()}; }

/// One chunk-pair problem: q, k, v, dout in their own buffers with row strides wider than the
/// heads and more rows per sequence than the chunk uses, so a kernel touching anything outside
/// the chunk's rows and head columns is caught (outputs start at a sentinel).
struct Problem {
  AttentionChunkDims d;
  std::int64_t qs, kvs, os;  // row strides of q/dq, k/v/dk/dv, out/dout
  std::vector<float> q, k, v, dout;
  QkvRows rows() const { return {q.data(), k.data(), v.data(), qs, kvs}; }
  std::size_t q_rows() const { return zu(d.batch * d.q_seq_rows); }
  std::size_t kv_rows() const { return zu(d.batch * d.kv_seq_rows); }
  std::size_t lse_size() const { return zu(d.batch * d.heads * d.lse_seq_len); }
};

Problem make_problem(AttentionChunkDims d, std::string_view tag) {
  d.q_seq_rows = d.q_len + 3;
  d.kv_seq_rows = d.kv_len + 2;
  d.lse_seq_len = d.q_len + 1;
  Problem p{d,
            d.heads * d.head_dim + 3,
            d.kv_heads * d.head_dim + 5,
            d.heads * d.head_dim + 2,
            {},
            {},
            {},
            {}};
  p.q = randn(p.q_rows() * zu(p.qs), std::string(tag) + ".q");
  p.k = randn(p.kv_rows() * zu(p.kvs), std::string(tag) + ".k");
  p.v = randn(p.kv_rows() * zu(p.kvs), std::string(tag) + ".v");
  p.dout = randn(p.q_rows() * zu(p.os), std::string(tag) + ".dout");
  return p;
}

/// Scalar double-precision attention of one chunk pair, straight from the definitions
/// (P = softmax over the visible keys of S = q·kᵀ/√d, O = P·v; dS = P∘(dP − rowsum(P∘dP)),
/// dq = dS·k/√d, dk = dSᵀ·q/√d, dv = Pᵀ·dO, dk and dv summed over each kv head's query heads),
/// in the layouts of the kernel. `shift` moves the causal diagonal (the broken-mask test).
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, AttentionMask mask, std::int64_t shift = 0) {
  const AttentionChunkDims& d = p.d;
  const std::int64_t hd = d.head_dim, group = d.heads / d.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Reference r{std::vector<double>(p.q_rows() * zu(p.os), 0.0), std::vector<double>(p.lse_size()),
              std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
              std::vector<double>(v.size(), 0.0)};
  const auto visible = [&](std::int64_t i, std::int64_t j) {
    if (mask == AttentionMask::skip) return false;
    return mask == AttentionMask::full || d.kv_offset + j <= d.q_offset + i + shift;
  };
  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t h = 0; h < d.heads; ++h) {
      const auto qv = [&](std::int64_t i, std::int64_t c) {
        return q[zu((b * d.q_seq_rows + i) * p.qs + h * hd + c)];
      };
      const auto kvat = [&](std::int64_t j, std::int64_t c) {
        return zu((b * d.kv_seq_rows + j) * p.kvs + (h / group) * hd + c);
      };
      for (std::int64_t i = 0; i < d.q_len; ++i) {
        const std::size_t o_at = zu((b * d.q_seq_rows + i) * p.os + h * hd);
        std::vector<double> s(zu(d.kv_len), -kInf);
        double m = -kInf;
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          if (!visible(i, j)) continue;
          double dot = 0.0;
          for (std::int64_t c = 0; c < hd; ++c) dot += qv(i, c) * k[kvat(j, c)];
          s[zu(j)] = dot * scale;
          m = std::max(m, s[zu(j)]);
        }
        double z = 0.0;
        for (const double sj : s) z += sj == -kInf ? 0.0 : std::exp(sj - m);
        r.lse[zu((b * d.heads + h) * d.lse_seq_len + i)] = z > 0.0 ? m + std::log(z) : -kInf;
        if (z == 0.0) continue;  // no visible key: out 0, no gradient
        std::vector<double> pr(zu(d.kv_len)), dp(zu(d.kv_len));
        double D = 0.0;
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          pr[zu(j)] = s[zu(j)] == -kInf ? 0.0 : std::exp(s[zu(j)] - m) / z;
          for (std::int64_t c = 0; c < hd; ++c) {
            r.out[o_at + zu(c)] += pr[zu(j)] * v[kvat(j, c)];
            dp[zu(j)] += p.dout[o_at + zu(c)] * v[kvat(j, c)];
          }
          D += pr[zu(j)] * dp[zu(j)];
        }
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          const double ds = pr[zu(j)] * (dp[zu(j)] - D) * scale;
          for (std::int64_t c = 0; c < hd; ++c) {
            r.dq[zu((b * d.q_seq_rows + i) * p.qs + h * hd + c)] += ds * k[kvat(j, c)];
            r.dk[kvat(j, c)] += ds * qv(i, c);
            r.dv[kvat(j, c)] += pr[zu(j)] * p.dout[o_at + zu(c)];
          }
        }
      }
    }
  }
  return r;
}

Reference reference(const Problem& p, AttentionMask mask, std::int64_t shift = 0) {
  return reference(p, to_double(p.q), to_double(p.k), to_double(p.v), mask, shift);
}

/// The kernel's results on a problem: forward, delta, backward into zeroed gradients.
struct Result {
  std::vector<float> out, lse, delta, dq, dk, dv;
};

constexpr float kSentinel = 7.0f;

/// Forward, delta and backward of one chunk pair; the gradients start as grad_fill everywhere.
Result run_kernel(const Problem& p, AttentionMask mask, GradWrite write = GradWrite::accumulate,
                  float grad_fill = 0.0f) {
  Result r{std::vector<float>(p.q_rows() * zu(p.os), kSentinel),
           std::vector<float>(p.lse_size(), kSentinel),
           std::vector<float>(p.lse_size(), kSentinel),
           std::vector<float>(p.q.size(), grad_fill),
           std::vector<float>(p.k.size(), grad_fill),
           std::vector<float>(p.v.size(), grad_fill)};
  attention_chunk_forward(p.rows(), p.d, mask, r.out.data(), p.os, r.lse.data());
  attention_delta(r.out.data(), p.dout.data(), p.os, p.d, r.delta.data());
  attention_chunk_backward(p.rows(), p.dout.data(), p.os, r.lse.data(), r.delta.data(),
                           {r.dq.data(), r.dk.data(), r.dv.data(), p.qs, p.kvs}, p.d, mask, write);
  return r;
}

/// The chunk's rows and head columns of a [batch·seq_rows, stride] buffer, and of the lse
/// layout; the rest must still hold what it held before the call.
template <class T>
std::vector<T> used(std::span<const T> buf, std::int64_t batch, std::int64_t seq_rows,
                    std::int64_t len, std::int64_t stride, std::int64_t width) {
  std::vector<T> x;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < len; ++i) {
      for (std::int64_t c = 0; c < width; ++c)
        x.push_back(buf[zu((b * seq_rows + i) * stride + c)]);
    }
  }
  return x;
}

/// Compares every output of the kernel with the double reference. The tolerances are those of
/// MaskKindsWithOffsetsMatchTheDoubleReference (reasoned there).
void expect_matches_reference(const Problem& p, const Result& got, const Reference& want,
                              const std::string& tag) {
  const AttentionChunkDims& d = p.d;
  const std::int64_t qw = d.heads * d.head_dim, kvw = d.kv_heads * d.head_dim;
  const auto qside = [&](std::span<const float> x, std::int64_t stride) {
    return used<float>(x, d.batch, d.q_seq_rows, d.q_len, stride, qw);
  };
  const auto qside_d = [&](std::span<const double> x, std::int64_t stride) {
    return used<double>(x, d.batch, d.q_seq_rows, d.q_len, stride, qw);
  };
  const auto kvside = [&](std::span<const float> x) {
    return used<float>(x, d.batch, d.kv_seq_rows, d.kv_len, p.kvs, kvw);
  };
  const auto kvside_d = [&](std::span<const double> x) {
    return used<double>(x, d.batch, d.kv_seq_rows, d.kv_len, p.kvs, kvw);
  };
  const auto lse_rows = [&](std::span<const float> x) {
    return used<float>(x, d.batch * d.heads, d.lse_seq_len, d.q_len, 1, 1);
  };
  const auto lse_rows_d = [&](std::span<const double> x) {
    return used<double>(x, d.batch * d.heads, d.lse_seq_len, d.q_len, 1, 1);
  };
  expect_near(qside(got.out, p.os), qside_d(want.out, p.os), 1e-5, 1e-6, "out" + tag);
  expect_near(lse_rows(got.lse), lse_rows_d(want.lse), 1e-6, 1e-6, "lse" + tag);
  expect_near(qside(got.dq, p.qs), qside_d(want.dq, p.qs), 1e-5, 1e-5, "dq" + tag);
  expect_near(kvside(got.dk), kvside_d(want.dk), 1e-5, 1e-5, "dk" + tag);
  expect_near(kvside(got.dv), kvside_d(want.dv), 1e-5, 1e-5, "dv" + tag);
  // Outside the chunk's rows and head columns nothing was written: the sentinels of out, lse
  // and the zeros of the gradients are still there (the reference holds 0 there too).
  const auto count = [](std::span<const float> x, float value) {
    return std::count(x.begin(), x.end(), value);
  };
  const auto outside = [](std::size_t total, std::size_t inside) {
    return static_cast<std::ptrdiff_t>(total - inside);
  };
  EXPECT_EQ(count(got.out, kSentinel), outside(got.out.size(), zu(d.batch * d.q_len * qw))) << tag;
  EXPECT_EQ(count(got.lse, kSentinel), outside(got.lse.size(), zu(d.batch * d.heads * d.q_len)))
      << tag;
  const auto zeros_outside = [&](std::span<const float> x, std::int64_t seq_rows, std::int64_t len,
                                 std::int64_t stride, std::int64_t width) {
    std::vector<float> copy(x.begin(), x.end());
    for (std::int64_t b = 0; b < d.batch; ++b) {
      for (std::int64_t i = 0; i < len; ++i) {
        std::fill_n(copy.begin() + (b * seq_rows + i) * stride, width, 0.0f);
      }
    }
    return std::all_of(copy.begin(), copy.end(), [](float f) { return f == 0.0f; });
  };
  EXPECT_TRUE(zeros_outside(got.dq, d.q_seq_rows, d.q_len, p.qs, qw)) << "dq padding" << tag;
  EXPECT_TRUE(zeros_outside(got.dk, d.kv_seq_rows, d.kv_len, p.kvs, kvw)) << "dk padding" << tag;
  EXPECT_TRUE(zeros_outside(got.dv, d.kv_seq_rows, d.kv_len, p.kvs, kvw)) << "dv padding" << tag;
}

AttentionChunkDims chunk(std::int64_t batch, std::int64_t q_len, std::int64_t kv_len,
                         std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                         std::int64_t q_offset, std::int64_t kv_offset) {
  return {batch, q_len, kv_len, heads, kv_heads, head_dim, q_offset, kv_offset, 0, 0, 0};
}

// ---------------------------------------------------------------------------------------------
// The full causal sequence against today's kernel (gqa_attention_*)

struct FullCase {
  std::int64_t batch, T, heads, kv_heads, head_dim;
  bool fused;  // GPT-2's c_attn row [q | k | v] (kv_heads == heads), else padded own buffers
};

TEST(FlashAttentionKernel, FullCausalSequenceMatchesTheGqaKernel) {
  const FullCase cases[] = {
      {1, 1, 2, 2, 8, true},    {2, 37, 4, 4, 16, true},   {3, 100, 6, 6, 64, true},
      {2, 257, 2, 2, 12, true}, {1, 257, 4, 2, 32, false}, {2, 100, 4, 1, 24, false},
      {3, 37, 4, 2, 8, false},  {1, 257, 8, 2, 64, false}, {1, 130, 4, 1, 40, false}};
  for (const FullCase& fc : cases) {
    const std::int64_t B = fc.batch, T = fc.T, C = fc.heads * fc.head_dim;
    const std::int64_t kvw = fc.kv_heads * fc.head_dim;
    const std::int64_t qs = fc.fused ? 3 * C : C + 3, kvs = fc.fused ? 3 * C : kvw + 5;
    const auto qbuf = randn(zu(B * T * qs), "full.q");
    const auto kbuf = fc.fused ? std::vector<float>{} : randn(zu(B * T * kvs), "full.k");
    const auto vbuf = fc.fused ? std::vector<float>{} : randn(zu(B * T * kvs), "full.v");
    const QkvRows in = fc.fused
                           ? QkvRows{qbuf.data(), qbuf.data() + C, qbuf.data() + 2 * C, qs, kvs}
                           : QkvRows{qbuf.data(), kbuf.data(), vbuf.data(), qs, kvs};
    const auto dout = randn(zu(B * T * C), "full.dout");
    const std::size_t n_out = zu(B * T * C), n_lse = zu(B * fc.heads * T);
    const std::size_t n_q = zu(B * T * qs), n_kv = fc.fused ? n_q : zu(B * T * kvs);

    std::vector<float> out_old(n_out), lse_old(n_lse), dq_old(n_q, 0.0f), dk_old(n_kv, 0.0f),
        dv_old(n_kv, 0.0f);
    const GqaDims gd{B, T, fc.heads, fc.kv_heads, fc.head_dim};
    gqa_attention_forward(in, out_old.data(), lse_old.data(), gd);
    // Fused: dq, dk, dv are column ranges of one buffer, as the layer passes them.
    std::vector<float> dqkv_old(fc.fused ? n_q : 0, 0.0f), dqkv_new(fc.fused ? n_q : 0, 0.0f);
    std::vector<float> dq_new(n_q, 0.0f), dk_new(n_kv, 0.0f), dv_new(n_kv, 0.0f);
    const auto grads = [&](std::vector<float>& fused, std::vector<float>& dq,
                           std::vector<float>& dk, std::vector<float>& dv) {
      return fc.fused ? QkvGradRows{fused.data(), fused.data() + C, fused.data() + 2 * C, qs, kvs}
                      : QkvGradRows{dq.data(), dk.data(), dv.data(), qs, kvs};
    };
    gqa_attention_backward(in, out_old.data(), lse_old.data(), dout.data(),
                           grads(dqkv_old, dq_old, dk_old, dv_old), gd);

    AttentionChunkDims d = chunk(B, T, T, fc.heads, fc.kv_heads, fc.head_dim, 0, 0);
    d.q_seq_rows = d.kv_seq_rows = d.lse_seq_len = T;
    std::vector<float> out_new(n_out), lse_new(n_lse), delta(n_lse);
    attention_chunk_forward(in, d, AttentionMask::causal, out_new.data(), C, lse_new.data());
    attention_delta(out_new.data(), dout.data(), C, d, delta.data());
    attention_chunk_backward(in, dout.data(), C, lse_new.data(), delta.data(),
                             grads(dqkv_new, dq_new, dk_new, dv_new), d, AttentionMask::causal);

    // Both kernels are f32 with the same exp_approx; they differ in summation order (tiled
    // 64-key blocks, FMA chains), in the online max/rescaling of the forward and in where the
    // scale is applied. Each output is a sum of ≤ T·group O(1) terms, so the difference is a
    // few ε·√terms: measured max abs 3.0e-7 (out), 9.5e-7 (lse), 6.0e-6 (dk, T = 130 with 4
    // query heads per kv head), ≤ 1.9e-6 for dq, dv, dqkv. Tolerances are ≈ 5–10× that; a
    // wrong mask, scale or dropped tile moves values by O(0.01–1) (OffByOneMaskFailsTheTolerances).
    const std::string tag = " (B=" + std::to_string(B) + " T=" + std::to_string(T) +
                            " heads=" + std::to_string(fc.heads) + "/" +
                            std::to_string(fc.kv_heads) + " d=" + std::to_string(fc.head_dim) +
                            (fc.fused ? " fused)" : ")");
    expect_near(out_new, to_double(out_old), 2e-6, 2e-6, "out" + tag);
    expect_near(lse_new, to_double(lse_old), 2e-6, 2e-6, "lse" + tag);
    if (fc.fused) {
      expect_near(dqkv_new, to_double(dqkv_old), 1e-5, 1e-5, "dqkv" + tag);
    } else {
      expect_near(dq_new, to_double(dq_old), 1e-5, 1e-5, "dq" + tag);
      expect_near(dk_new, to_double(dk_old), 1e-5, 1e-5, "dk" + tag);
      expect_near(dv_new, to_double(dv_old), 1e-5, 1e-5, "dv" + tag);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Mask kinds and offsets against the double reference

struct MaskCase {
  AttentionChunkDims d;
  AttentionMask mask;
  const char* what;
};

std::vector<MaskCase> mask_cases() {
  using M = AttentionMask;
  return {
      {chunk(2, 50, 70, 4, 2, 16, 96, 64), M::causal, "causal, query chunk after key chunk"},
      {chunk(1, 70, 50, 4, 4, 24, 64, 96), M::causal, "causal, key chunk after (rows see none)"},
      {chunk(2, 40, 100, 2, 1, 32, 300, 0), M::causal, "causal, wholly visible"},
      {chunk(1, 40, 60, 4, 2, 8, 0, 100), M::causal, "causal, wholly invisible"},
      {chunk(1, 130, 130, 2, 1, 64, 0, 0), M::causal, "causal, 3 blocks on the diagonal"},
      {chunk(2, 77, 65, 3, 3, 20, 64, 0), M::causal, "causal, diagonal inside a block"},
      {chunk(2, 33, 129, 4, 2, 16, 5, 200), M::full, "full (offsets ignored)"},
      {chunk(1, 20, 30, 2, 2, 8, 0, 0), M::skip, "skip"},
      {chunk(1, 100, 110, 2, 1, 128, 20, 0), M::causal, "head_dim 128"},
      {chunk(1, 50, 96, 2, 2, 100, 0, 0), M::full, "head_dim 100 (padded to whole vectors)"},
      {chunk(1, 0, 10, 2, 1, 8, 0, 0), M::causal, "no query rows"},
      {chunk(2, 10, 0, 2, 1, 8, 0, 0), M::full, "no keys"},
  };
}

TEST(FlashAttentionKernel, MaskKindsWithOffsetsMatchTheDoubleReference) {
  // Tolerances (expect_matches_reference): out is a convex combination of O(1) values, its
  // error the f32 score dots (≈ √head_dim·ε) through exp plus the tiled sums: measured max
  // 8.5e-7 abs, tolerance 1e-5 rel + 1e-6 abs (worst ratio 0.3); lse 1e-6 (measured 8.4e-7
  // on |lse| ≈ 5); the gradients sum ≤ kv_len (dq) or q_len·group (dk, dv) O(1) terms:
  // measured max 2.0e-6, tolerance 1e-5.
  for (const MaskCase& mc : mask_cases()) {
    const Problem p = make_problem(mc.d, "mask");
    const Result got = run_kernel(p, mc.mask);
    expect_matches_reference(p, got, reference(p, mc.mask), std::string(" (") + mc.what + ")");
  }
}

TEST(FlashAttentionKernel, RowsThatSeeNoKeyGetZeroAndMinusInfinity) {
  // Queries 64..133 against keys 96..145: query rows 0..31 see no key.
  const Problem p = make_problem(chunk(1, 70, 50, 2, 1, 8, 64, 96), "empty");
  const Result got = run_kernel(p, AttentionMask::causal);
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t i = 0; i < 70; ++i) {
      const float lse = got.lse[zu(h * p.d.lse_seq_len + i)];
      EXPECT_EQ(std::isinf(lse) && lse < 0, i < 32) << "h=" << h << " i=" << i;
      if (i >= 32) continue;
      for (std::int64_t c = 0; c < 8; ++c) {
        EXPECT_EQ(got.out[zu(i * p.os + h * 8 + c)], 0.0f);
        EXPECT_EQ(got.dq[zu(i * p.qs + h * 8 + c)], 0.0f);
      }
    }
  }
  const Result skipped = run_kernel(p, AttentionMask::skip);
  EXPECT_TRUE(std::all_of(skipped.dk.begin(), skipped.dk.end(), [](float f) { return f == 0; }));
}

TEST(FlashAttentionKernel, OffByOneMaskFailsTheTolerances) {
  // The reference with the causal diagonal moved by ±1 (query i also sees key i + 1, or not
  // key i) must be far outside the tolerances the real reference passes: the assertions above
  // would catch a mask off by one.
  for (const AttentionChunkDims& d :
       {chunk(2, 50, 70, 4, 2, 16, 96, 64), chunk(1, 130, 130, 2, 1, 64, 0, 0)}) {
    const Problem p = make_problem(d, "mask");
    const Result got = run_kernel(p, AttentionMask::causal);
    for (const std::int64_t shift : {-1, 1}) {
      const Reference wrong = reference(p, AttentionMask::causal, shift);
      EXPECT_GT(worst_ratio(got.out, wrong.out, 1e-5, 1e-6), 100.0) << "shift " << shift;
      EXPECT_GT(worst_ratio(got.dq, wrong.dq, 1e-5, 1e-5), 100.0) << "shift " << shift;
      EXPECT_GT(worst_ratio(got.dk, wrong.dk, 1e-5, 1e-5), 100.0) << "shift " << shift;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Chunked (ring attention): per-pair forward + merge, per-pair backward from the final lse

/// The pair (query chunk [qa, qb), key chunk [ka, kb)) of a whole-sequence problem: the same
/// buffers, pointers moved to the chunks' first rows, global offsets qa and ka.
struct Pair {
  AttentionChunkDims d;
  std::int64_t qa, ka;
};
Pair pair_of(const AttentionChunkDims& whole, std::int64_t qa, std::int64_t qb, std::int64_t ka,
             std::int64_t kb) {
  AttentionChunkDims d = whole;
  d.q_len = qb - qa;
  d.kv_len = kb - ka;
  d.q_offset = qa;
  d.kv_offset = ka;
  return {d, qa, ka};
}

/// Ring attention's mask choice for chunks of one causal sequence.
AttentionMask ring_mask(std::size_t query_chunk, std::size_t key_chunk) {
  if (key_chunk < query_chunk) return AttentionMask::full;
  return key_chunk == query_chunk ? AttentionMask::causal : AttentionMask::skip;
}

TEST(FlashAttentionKernel, ChunkedForwardMergeAndBackwardEqualOneCall) {
  const std::int64_t T = 150;
  const Problem p = make_problem(chunk(2, T, T, 4, 2, 16, 0, 0), "chunks");
  const Result whole = run_kernel(p, AttentionMask::causal);
  const QkvRows in = p.rows();
  for (const std::vector<std::int64_t>& cuts :
       {std::vector<std::int64_t>{0, 64, T}, std::vector<std::int64_t>{0, 37, 100, T},
        std::vector<std::int64_t>{0, 30, 70, 110, T}}) {
    const std::size_t n = cuts.size() - 1;
    // Accumulators start at "nothing seen": lse = −inf and a garbage out that the first merge
    // must replace, not weigh.
    std::vector<float> out(whole.out.size(), 3.0f), lse(whole.lse.size(), -INFINITY);
    std::vector<float> part(whole.out.size()), part_lse(whole.lse.size());
    std::vector<float> part_causal(whole.out.size()), part_causal_lse(whole.lse.size());
    std::vector<float> dq(p.q.size(), 0.0f), dk(p.k.size(), 0.0f), dv(p.v.size(), 0.0f);
    for (std::size_t qc = 0; qc < n; ++qc) {
      for (std::size_t kc = 0; kc < n; ++kc) {
        const Pair pr = pair_of(p.d, cuts[qc], cuts[qc + 1], cuts[kc], cuts[kc + 1]);
        const QkvRows rows{in.q + pr.qa * p.qs, in.k + pr.ka * p.kvs, in.v + pr.ka * p.kvs, p.qs,
                           p.kvs};
        const std::int64_t o_at = pr.qa * p.os;
        attention_chunk_forward(rows, pr.d, ring_mask(qc, kc), part.data() + o_at, p.os,
                                part_lse.data() + pr.qa);
        // Causal with offsets is full on a wholly visible pair and skip on an invisible one,
        // to the bit: ring attention may pass either.
        attention_chunk_forward(rows, pr.d, AttentionMask::causal, part_causal.data() + o_at, p.os,
                                part_causal_lse.data() + pr.qa);
        attention_merge(out.data() + o_at, p.os, lse.data() + pr.qa, part.data() + o_at, p.os,
                        part_lse.data() + pr.qa, pr.d);
        // Backward of the pair from the FINAL lse and delta (of the one call).
        attention_chunk_backward(rows, p.dout.data() + o_at, p.os, whole.lse.data() + pr.qa,
                                 whole.delta.data() + pr.qa,
                                 {dq.data() + pr.qa * p.qs, dk.data() + pr.ka * p.kvs,
                                  dv.data() + pr.ka * p.kvs, p.qs, p.kvs},
                                 pr.d, ring_mask(qc, kc));
      }
    }
    EXPECT_EQ(part, part_causal);
    EXPECT_EQ(std::vector<float>(part_lse), part_causal_lse);
    // Merging re-weighs each partial output by e^(lse_part − lse) ≤ 1 and adds: a few ε of
    // O(1) values per merge (measured max abs 3.6e-7 out, 9.5e-7 lse); the chunked backward
    // sums the same tile products as the one call but in pair order: measured max 3.3e-6.
    const std::string tag = " (" + std::to_string(n) + " chunks)";
    const auto used_out = [&](std::span<const float> x) {
      return used<float>(x, p.d.batch, p.d.q_seq_rows, T, p.os, 4 * 16);
    };
    expect_near(used_out(out), to_double(used_out(whole.out)), 1e-5, 2e-6, "merged out" + tag);
    const auto used_lse = [&](std::span<const float> x) {
      return used<float>(x, 8, p.d.lse_seq_len, T, 1, 1);
    };
    expect_near(used_lse(lse), to_double(used_lse(whole.lse)), 2e-6, 2e-6, "merged lse" + tag);
    expect_near(dq, to_double(whole.dq), 1e-5, 1e-5, "chunked dq" + tag);
    expect_near(dk, to_double(whole.dk), 1e-5, 1e-5, "chunked dk" + tag);
    expect_near(dv, to_double(whole.dv), 1e-5, 1e-5, "chunked dv" + tag);
  }
}

TEST(FlashAttentionKernel, MergeHandlesMinusInfinityOnEitherSideExactly) {
  const AttentionChunkDims d = [] {
    AttentionChunkDims c = chunk(1, 3, 0, 1, 1, 2, 0, 0);
    c.q_seq_rows = c.lse_seq_len = 3;
    return c;
  }();
  // Row 0: both finite; row 1: the part is empty; row 2: the accumulator is empty.
  std::vector<float> out = {1.0f, 2.0f, 5.0f, 6.0f, 9.0f, 9.0f};
  std::vector<float> lse = {0.5f, 1.0f, -INFINITY};
  const std::vector<float> part = {3.0f, 4.0f, 7.0f, 8.0f, -1.0f, 2.5f};
  const std::vector<float> part_lse = {0.5f + std::log(3.0f), -INFINITY, 0.25f};
  attention_merge(out.data(), 2, lse.data(), part.data(), 2, part_lse.data(), d);
  // Row 0: weights 1 : 3 → out = (1·[1, 2] + 3·[3, 4]) / 4, lse = 0.5 + log 4.
  EXPECT_NEAR(out[0], 2.5f, 1e-6f);
  EXPECT_NEAR(out[1], 3.5f, 1e-6f);
  EXPECT_NEAR(lse[0], 0.5f + std::log(4.0f), 1e-6f);
  EXPECT_EQ(out[2], 5.0f);
  EXPECT_EQ(out[3], 6.0f);
  EXPECT_EQ(lse[1], 1.0f);
  EXPECT_EQ(out[4], -1.0f);
  EXPECT_EQ(out[5], 2.5f);
  EXPECT_EQ(lse[2], 0.25f);
}

// ---------------------------------------------------------------------------------------------
// Finite differences of L = Σ w∘out

TEST(FlashAttentionKernel, BackwardMatchesFiniteDifferences) {
  // A causal pair with the diagonal inside the chunks (queries 3..8, keys 1..7) and grouped
  // heads; w is the problem's dout.
  for (const AttentionMask mask : {AttentionMask::causal, AttentionMask::full}) {
    Problem p = make_problem(chunk(1, 6, 7, 2, 1, 4, 3, 1), "fd");
    const Result got = run_kernel(p, mask);
    const auto loss_ref = [&](std::vector<double>& q, std::vector<double>& k,
                              std::vector<double>& v) {
      const Reference r = reference(p, q, k, v, mask);
      double l = 0.0;
      for (std::size_t i = 0; i < r.out.size(); ++i) l += p.dout[i] * r.out[i];
      return l;
    };
    const auto loss_kernel = [&] {
      std::vector<float> out(got.out.size(), 0.0f), lse(got.lse.size());
      attention_chunk_forward(p.rows(), p.d, mask, out.data(), p.os, lse.data());
      double l = 0.0;
      for (std::size_t i = 0; i < out.size(); ++i) l += double{p.dout[i]} * out[i];
      return l;
    };
    std::vector<double> q = to_double(p.q), k = to_double(p.k), v = to_double(p.v);
    const std::string tag = mask == AttentionMask::causal ? " (causal)" : " (full)";
    // x is one of q, k, v (double for the reference), xf the kernel's f32 copy of it.
    const auto check = [&](std::vector<double>& x, std::vector<float>& xf,
                           const std::vector<float>& grad, const char* name) {
      std::vector<double> fd_ref(x.size()), fd_kernel(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        // The double reference: h = 1e-4 leaves truncation ≈ h²·f‴/6 ≈ 1e-9 and rounding
        // ≈ 1e-16/h: the analytic gradient to ≈ 1e-8; the kernel's f32 gradient is within a
        // few ε of it (measured 1.7e-7), tolerance 1e-5.
        const double saved = x[i];
        x[i] = saved + 1e-4;
        const double lp = loss_ref(q, k, v);
        x[i] = saved - 1e-4;
        const double lm = loss_ref(q, k, v);
        x[i] = saved;
        fd_ref[i] = (lp - lm) / 2e-4;
        // The kernel's own f32 forward, h = 1e-2 (as kernels_test's GQA FD): truncation
        // ≈ 2e-5, output rounding ≈ 1e-5; tolerance 1e-3 (measured 3.9e-5).
        const float fs = xf[i], plus = fs + 1e-2f, minus = fs - 1e-2f;
        xf[i] = plus;
        const double kp = loss_kernel();
        xf[i] = minus;
        const double km = loss_kernel();
        xf[i] = fs;
        fd_kernel[i] = (kp - km) / (double{plus} - double{minus});
      }
      expect_near(grad, fd_ref, 1e-5, 1e-5, std::string(name) + " vs FD of the reference" + tag);
      expect_near(grad, fd_kernel, 1e-3, 1e-3, std::string(name) + " vs FD of the kernel" + tag);
    };
    check(q, p.q, got.dq, "dq");
    check(k, p.k, got.dk, "dk");
    check(v, p.v, got.dv, "dv");
  }
}

// ---------------------------------------------------------------------------------------------
// Threads, checks

TEST(FlashAttentionKernel, OneAndTwoThreadsGiveTheSameBits) {
  // The last case below runs both backward schedules only while this holds.
  ASSERT_TRUE(cpu::flash::fused_backward(3, 1));
  ASSERT_FALSE(cpu::flash::fused_backward(3, 2));
  const int saved = num_threads();
  for (const MaskCase& mc :
       {MaskCase{chunk(2, 150, 150, 4, 2, 32, 0, 0), AttentionMask::causal, "causal"},
        MaskCase{chunk(1, 100, 200, 4, 1, 16, 96, 64), AttentionMask::causal, "causal, offsets"},
        MaskCase{chunk(3, 70, 90, 2, 2, 64, 0, 0), AttentionMask::full, "full"},
        // 3 (sequence, kv head) tasks: fused backward with 1 thread, two passes with 2
        // (cpu::flash::fused_backward); head_dim 48, a scale 1/√48 that rounds, so the two
        // schedules agree only if both put the scale on the same operand.
        MaskCase{chunk(3, 110, 110, 2, 1, 48, 0, 0), AttentionMask::causal, "fused vs 2 passes"}}) {
    const Problem p = make_problem(mc.d, "threads");
    set_num_threads(1);
    const Result one = run_kernel(p, mc.mask);
    set_num_threads(2);
    const Result two = run_kernel(p, mc.mask);
    EXPECT_EQ(one.out, two.out) << mc.what;
    EXPECT_EQ(one.lse, two.lse) << mc.what;
    EXPECT_EQ(one.delta, two.delta) << mc.what;
    EXPECT_EQ(one.dq, two.dq) << mc.what;
    EXPECT_EQ(one.dk, two.dk) << mc.what;
    EXPECT_EQ(one.dv, two.dv) << mc.what;
  }
  set_num_threads(saved);
}

TEST(FlashAttentionKernel, OverwriteIsAccumulatingIntoZerosBitwiseWhateverTheGradientsHeld) {
  // GradWrite::overwrite into gradients full of NaN against the accumulation into zeros: the
  // chunk's rows and head columns bitwise equal, every other element still NaN (nothing
  // written outside). Skip must zero the chunk; the
  // causal case with offsets has key blocks no query sees, which must be written too. With 1
  // and 2 threads: the last case runs the fused backward with 1 and two passes with 2.
  const int saved = num_threads();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const MaskCase& mc :
       {MaskCase{chunk(2, 150, 150, 4, 2, 32, 0, 0), AttentionMask::causal, "causal"},
        MaskCase{chunk(1, 100, 200, 4, 1, 16, 96, 64), AttentionMask::causal, "causal, offsets"},
        MaskCase{chunk(3, 70, 90, 2, 2, 64, 0, 0), AttentionMask::full, "full"},
        MaskCase{chunk(2, 40, 60, 2, 1, 32, 0, 100), AttentionMask::skip, "skip"},
        MaskCase{chunk(3, 110, 110, 2, 1, 48, 0, 0), AttentionMask::causal, "fused vs 2 passes"}}) {
    const Problem p = make_problem(mc.d, "overwrite");
    const AttentionChunkDims& d = p.d;
    const std::int64_t qw = d.heads * d.head_dim, kvw = d.kv_heads * d.head_dim;
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      const Result acc = run_kernel(p, mc.mask);
      const Result over = run_kernel(p, mc.mask, GradWrite::overwrite, nan);
      const std::string tag = std::string(mc.what) + ", " + std::to_string(threads) + " thread(s)";
      const auto qside = [&](const std::vector<float>& x) {
        return used<float>(x, d.batch, d.q_seq_rows, d.q_len, p.qs, qw);
      };
      const auto kvside = [&](const std::vector<float>& x) {
        return used<float>(x, d.batch, d.kv_seq_rows, d.kv_len, p.kvs, kvw);
      };
      EXPECT_TRUE(test::same_bits(qside(over.dq), qside(acc.dq))) << "dq, " << tag;
      EXPECT_TRUE(test::same_bits(kvside(over.dk), kvside(acc.dk))) << "dk, " << tag;
      EXPECT_TRUE(test::same_bits(kvside(over.dv), kvside(acc.dv))) << "dv, " << tag;
      const auto nans = [](const std::vector<float>& x) {
        return std::count_if(x.begin(), x.end(), [](float f) { return std::isnan(f); });
      };
      EXPECT_EQ(zu(nans(over.dq)), over.dq.size() - zu(d.batch * d.q_len * qw)) << tag;
      EXPECT_EQ(zu(nans(over.dk)), over.dk.size() - zu(d.batch * d.kv_len * kvw)) << tag;
      EXPECT_EQ(zu(nans(over.dv)), over.dv.size() - zu(d.batch * d.kv_len * kvw)) << tag;
    }
  }
  set_num_threads(saved);
}

/// One Causal kind against the full tile product: A [m, k] with the masked factors zeroed
/// (the k kinds) or any values (the column kinds), random B and C. Every element the mask
/// leaves must equal the full product's bits; with the column kinds every skipped element of a
/// non-accumulating product must be 0. Returns how many micro-kernel columns × k products the
/// span skipped, so the caller can check the skipping is not empty.
std::int64_t check_causal_kind(cpu::flash::Causal::Kind kind, std::int64_t diag, bool accumulate) {
  using cpu::flash::Causal;
  using cpu::flash::kMR;
  using cpu::flash::kVec;
  const std::int64_t m = 4 * kMR, n = 3 * kVec, k = 40;
  const bool rows_are_keys = kind == Causal::Kind::cols_from || kind == Causal::Kind::k_from;
  // A key sees a query iff key ≤ query + diag, in the tile's own indices.
  const auto sees = [&](std::int64_t row, std::int64_t other) {
    return rows_are_keys ? row <= other + diag : other <= row + diag;
  };
  std::vector<float> a = randn(zu(m * k), "causal.a"), b = randn(zu(k * n), "causal.b");
  const std::vector<float> c0 = randn(zu(m * n), "causal.c");
  const bool k_kind = kind == Causal::Kind::k_from || kind == Causal::Kind::k_upto;
  if (k_kind) {
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t p = 0; p < k; ++p) {
        if (!sees(r, p)) a[zu(r * k + p)] = 0.0f;
      }
    }
  }
  std::vector<float> full = c0, skipped = c0;
  const cpu::flash::MatA A{a.data(), k, 1};
  cpu::flash::tile_gemm(A, b.data(), n, full.data(), n, m, n, k, accumulate);
  cpu::flash::tile_gemm(A, b.data(), n, skipped.data(), n, m, n, k, accumulate, {kind, diag});
  std::int64_t saved = 0;
  for (std::int64_t r = 0; r < m; ++r) {
    const cpu::flash::TileSpan span = cpu::flash::causal_span({kind, diag}, r / kMR * kMR, n, k);
    saved += (n - (span.col_end - span.col_begin)) * k + (k - (span.k_end - span.k_begin)) * n;
    for (std::int64_t c = 0; c < n; ++c) {
      const float got = skipped[zu(r * n + c)], want = full[zu(r * n + c)];
      if (k_kind || sees(r, c)) {
        EXPECT_EQ(got, want) << "kind " << int(kind) << " diag " << diag << " at " << r << "," << c;
      } else if (!accumulate && (c < span.col_begin || c >= span.col_end)) {
        EXPECT_EQ(got, 0.0f) << "kind " << int(kind) << " diag " << diag << " skipped " << r << ","
                             << c;
      }
    }
  }
  return saved;
}

TEST(FlashAttentionKernel, CausalTileSkippingKeepsTheFullProductsBits) {
  using Kind = cpu::flash::Causal::Kind;
  for (const Kind kind : {Kind::cols_from, Kind::cols_upto, Kind::k_from, Kind::k_upto}) {
    std::int64_t saved_on_diagonal = 0;
    for (std::int64_t diag = -60; diag <= 60; diag += 3) {
      for (const bool accumulate : {false, true}) {
        const std::int64_t saved = check_causal_kind(kind, diag, accumulate);
        if (diag == 0) saved_on_diagonal += saved;
      }
    }
    // A diagonal tile skips a real share of its products (about half of them).
    EXPECT_GT(saved_on_diagonal, 0) << "kind " << int(kind) << " skipped nothing on the diagonal";
  }
  // No mask: nothing skipped.
  const cpu::flash::TileSpan none = cpu::flash::causal_span({}, 6, 48, 40);
  EXPECT_EQ(none.col_begin, 0);
  EXPECT_EQ(none.col_end, 48);
  EXPECT_EQ(none.k_begin, 0);
  EXPECT_EQ(none.k_end, 40);
}

// The register-blocked transpose against the element-by-element definition, bit for bit: whole
// kVec × kVec blocks, ragged rows and columns past them, and the zeroed padding columns.
TEST(FlashAttentionKernel, PackTransposedEqualsTheElementByElementTranspose) {
  constexpr std::int64_t kVec = cpu::flash::kVec;
  const std::int64_t sizes[] = {1, kVec - 1, kVec, kVec + 3, 3 * kVec, 3 * kVec + 5};
  for (const std::int64_t n : sizes) {
    for (const std::int64_t hd : sizes) {
      const std::int64_t stride = hd + 7, padded = cpu::flash::round_up(n, kVec) + kVec;
      const std::int64_t ld = padded + 2;
      const auto src = randn(zu(n * stride), "pack.src");
      std::vector<float> got(zu(hd * ld), -1.0f), want(zu(hd * ld), -1.0f);
      for (std::int64_t c = 0; c < hd; ++c) {
        for (std::int64_t r = 0; r < padded; ++r)
          want[zu(c * ld + r)] = r < n ? 0.75f * src[zu(r * stride + c)] : 0.0f;
      }
      cpu::flash::pack_transposed(src.data(), stride, n, hd, 0.75f, ld, padded, got.data());
      EXPECT_EQ(got, want) << "n=" << n << " hd=" << hd;
    }
  }
}

TEST(FlashAttentionKernelDeathTest, BadDimsAndStridesAbort) {
  // OpenMP threads exist by now: re-execute the binary for each death test instead of fork().
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> buf(4096, 0.0f), out(4096), lse(256);
  const QkvRows in{buf.data(), buf.data(), buf.data(), 32, 32};
  const QkvGradRows g{out.data(), out.data(), out.data(), 32, 32};
  const auto dims = [](std::int64_t heads, std::int64_t kv_heads, std::int64_t q_len,
                       std::int64_t q_seq_rows) {
    AttentionChunkDims d = chunk(1, q_len, 4, heads, kv_heads, 8, 0, 0);
    d.q_seq_rows = q_seq_rows;
    d.kv_seq_rows = 4;
    d.lse_seq_len = 4;
    return d;
  };
  const auto fwd = [&](const QkvRows& rows, const AttentionChunkDims& d, std::int64_t os) {
    attention_chunk_forward(rows, d, AttentionMask::causal, out.data(), os, lse.data());
  };
  EXPECT_DEATH(fwd(in, dims(4, 3, 4, 4), 32), "bad dims");   // heads % kv_heads
  EXPECT_DEATH(fwd(in, dims(4, 0, 4, 4), 32), "bad dims");   // kv_heads = 0
  EXPECT_DEATH(fwd(in, dims(4, 2, 4, 3), 32), "bad dims");   // q_seq_rows < q_len
  EXPECT_DEATH(fwd(in, dims(4, 2, -1, 4), 32), "bad dims");  // q_len < 0
  EXPECT_DEATH(fwd({buf.data(), buf.data(), buf.data(), 31, 32}, dims(4, 2, 4, 4), 32),
               "strides");  // q narrower than 4·8
  EXPECT_DEATH(fwd({buf.data(), buf.data(), buf.data(), 32, 15}, dims(4, 2, 4, 4), 32),
               "strides");                                 // kv narrower than 2·8
  EXPECT_DEATH(fwd(in, dims(4, 2, 4, 4), 31), "strides");  // out narrower
  EXPECT_DEATH(
      attention_merge(out.data(), 31, lse.data(), buf.data(), 32, lse.data(), dims(4, 2, 4, 4)),
      "strides");
  EXPECT_DEATH(attention_delta(out.data(), buf.data(), 31, dims(4, 2, 4, 4), lse.data()),
               "row stride");
  EXPECT_DEATH(attention_chunk_backward(in, buf.data(), 32, lse.data(), lse.data(),
                                        {out.data(), out.data(), out.data(), 32, 15},
                                        dims(4, 2, 4, 4), AttentionMask::causal),
               "gradient row strides");
  EXPECT_DEATH(attention_chunk_backward(in, buf.data(), 32, lse.data(), lse.data(), g,
                                        dims(4, 2, 5, 5), AttentionMask::full),
               "bad dims");  // lse_seq_len 4 < q_len 5
}

}  // namespace
}  // namespace meshtrain::kernels
