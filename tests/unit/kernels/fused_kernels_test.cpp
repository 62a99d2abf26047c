// tests/unit/kernels/fused_kernels_test.cpp
//
// The fused element-wise passes against the unfused calls they replace, bit for bit (fp32):
// residual add + LayerNorm / RMSNorm forward (h = a + b, then the norm) and backward (the
// norm's dx plus the residual's gradient), at the kernel level and through TransformerBlock
// (a block whose norms are hidden behind a plain Module takes the unfused path); the fc bias
// add + GELU and GELU backward + bias gradient; the one-pass softmax statistics of the loss over
// an unsharded vocabulary; AdamW with the clipping factor folded in; the gradients' zeroing in
// one region (zero_all). Each row's result must not depend on how many rows a call gets
// (expert-parallel and context-parallel runs split the tokens differently): the kernels are
// also compared over the rows split in two calls, and with 1 and 2 threads.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/bitwise.h"
#include "support/placements.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/norms.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/transformer/transformer_block.h"

namespace meshtrain {
namespace {

constexpr std::uint64_t kSeed = 4321;

std::vector<float> randn(std::size_t n, std::string_view name, float stddev = 1.0f,
                         float mean = 0.0f) {
  return test::randn(kSeed, n, name, stddev, mean);
}

using test::same_bits;

struct NormCase {
  std::int64_t rows, C;
  bool bias;
};

// Rows 1 (a decode-sized call), 7 (an odd expert share), 1024 (6L/384's step), C odd and even.
const NormCase kCases[] = {{1, 384, true}, {7, 37, false}, {1024, 384, true}, {33, 128, false}};

struct LnOut {
  std::vector<float> h, y, mean, rstd;
};

LnOut ln_unfused(const std::vector<float>& a, const std::vector<float>& b,
                 const std::vector<float>& w, const float* bias, const NormCase& c) {
  LnOut o{a, std::vector<float>(a.size()), std::vector<float>(c.rows), std::vector<float>(c.rows)};
  kernels::add_inplace(o.h.data(), b.data(), static_cast<std::int64_t>(a.size()));
  kernels::layernorm_forward(o.h.data(), w.data(), bias, o.y.data(), o.mean.data(), o.rstd.data(),
                             c.rows, c.C, 1e-5f);
  return o;
}

// The fused forward over rows [0, split) and [split, rows) in two calls (split = rows: one call).
LnOut ln_fused(const std::vector<float>& a, const std::vector<float>& b,
               const std::vector<float>& w, const float* bias, const NormCase& c,
               std::int64_t split) {
  LnOut o{a, std::vector<float>(a.size()), std::vector<float>(c.rows), std::vector<float>(c.rows)};
  for (const auto& [r0, r1] : {std::pair{std::int64_t{0}, split}, std::pair{split, c.rows}}) {
    if (r1 == r0) continue;
    const std::int64_t off = r0 * c.C;
    kernels::residual_layernorm_forward(o.h.data() + off, b.data() + off, o.h.data() + off,
                                        w.data(), bias, o.y.data() + off, o.mean.data() + r0,
                                        o.rstd.data() + r0, r1 - r0, c.C, 1e-5f);
  }
  return o;
}

TEST(FusedResidualNorm, LayerNormForwardIsAddThenNormBitwise) {
  for (const NormCase& c : kCases) {
    const auto n = static_cast<std::size_t>(c.rows * c.C);
    // A residual stream with |mean| ≫ std, as late in training (the two-pass variance matters).
    const auto a = randn(n, "ln.a", 1.0f, 3.0f), b = randn(n, "ln.b", 0.5f);
    const auto w = randn(static_cast<std::size_t>(c.C), "ln.w", 0.3f, 1.0f);
    const auto bias = randn(static_cast<std::size_t>(c.C), "ln.bias");
    const float* bp = c.bias ? bias.data() : nullptr;
    const LnOut ref = ln_unfused(a, b, w, bp, c);
    for (const int threads : {1, 2}) {
      kernels::set_num_threads(threads);
      for (const std::int64_t split : {c.rows, c.rows / 2}) {
        SCOPED_TRACE("rows " + std::to_string(c.rows) + " C " + std::to_string(c.C) + " threads " +
                     std::to_string(threads) + " split " + std::to_string(split));
        const LnOut got = ln_fused(a, b, w, bp, c, split);
        EXPECT_TRUE(same_bits(got.h, ref.h));
        EXPECT_TRUE(same_bits(got.y, ref.y));
        EXPECT_TRUE(same_bits(got.mean, ref.mean));
        EXPECT_TRUE(same_bits(got.rstd, ref.rstd));
      }
    }
    kernels::set_num_threads(1);
  }
}

TEST(FusedResidualNorm, LayerNormBackwardAddsTheResidualGradientBitwise) {
  for (const NormCase& c : kCases) {
    const auto n = static_cast<std::size_t>(c.rows * c.C);
    const auto x = randn(n, "lnb.x", 1.0f, 2.0f), dy = randn(n, "lnb.dy");
    const auto dres = randn(n, "lnb.dres");
    const auto w = randn(static_cast<std::size_t>(c.C), "lnb.w", 0.3f, 1.0f);
    std::vector<float> y(n), mean(static_cast<std::size_t>(c.rows)), rstd(mean.size());
    kernels::layernorm_forward(x.data(), w.data(), nullptr, y.data(), mean.data(), rstd.data(),
                               c.rows, c.C, 1e-5f);
    const auto dw0 = randn(static_cast<std::size_t>(c.C), "lnb.dw0");  // accumulated into
    std::vector<float> dx_ref(n), dw_ref = dw0, db_ref = dw0;
    kernels::layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                dx_ref.data(), dw_ref.data(), c.bias ? db_ref.data() : nullptr,
                                c.rows, c.C);
    kernels::add_inplace(dx_ref.data(), dres.data(), static_cast<std::int64_t>(n));
    for (const int threads : {1, 2}) {
      kernels::set_num_threads(threads);
      SCOPED_TRACE("rows " + std::to_string(c.rows) + " threads " + std::to_string(threads));
      std::vector<float> dx(n), dw = dw0, db = dw0;
      kernels::layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                  dres.data(), dx.data(), dw.data(), c.bias ? db.data() : nullptr,
                                  c.rows, c.C);
      EXPECT_TRUE(same_bits(dx, dx_ref));
      EXPECT_TRUE(same_bits(dw, dw_ref));
      EXPECT_TRUE(same_bits(db, db_ref));
    }
    kernels::set_num_threads(1);
  }
}

TEST(FusedResidualNorm, RmsNormForwardAndBackwardAreTheUnfusedCallsBitwise) {
  for (const NormCase& c : kCases) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " C " + std::to_string(c.C));
    const auto n = static_cast<std::size_t>(c.rows * c.C);
    const auto a = randn(n, "rms.a", 1.0f, 1.0f), b = randn(n, "rms.b");
    const auto dy = randn(n, "rms.dy"), dres = randn(n, "rms.dres");
    const auto w = randn(static_cast<std::size_t>(c.C), "rms.w", 0.3f, 1.0f);
    const auto rows = static_cast<std::size_t>(c.rows);
    std::vector<float> h_ref = a, y_ref(n), rstd_ref(rows);
    kernels::add_inplace(h_ref.data(), b.data(), static_cast<std::int64_t>(n));
    kernels::rmsnorm_forward(h_ref.data(), w.data(), y_ref.data(), rstd_ref.data(), c.rows, c.C,
                             1e-6f);
    std::vector<float> h = a, y(n), rstd(rows);
    kernels::residual_rmsnorm_forward(h.data(), b.data(), h.data(), w.data(), y.data(), rstd.data(),
                                      c.rows, c.C, 1e-6f);
    EXPECT_TRUE(same_bits(h, h_ref));
    EXPECT_TRUE(same_bits(y, y_ref));
    EXPECT_TRUE(same_bits(rstd, rstd_ref));

    std::vector<float> dx_ref(n), dw_ref(static_cast<std::size_t>(c.C), 0.25f);
    kernels::rmsnorm_backward(h.data(), w.data(), rstd.data(), dy.data(), dx_ref.data(),
                              dw_ref.data(), c.rows, c.C);
    kernels::add_inplace(dx_ref.data(), dres.data(), static_cast<std::int64_t>(n));
    std::vector<float> dx(n), dw(static_cast<std::size_t>(c.C), 0.25f);
    kernels::rmsnorm_backward(h.data(), w.data(), rstd.data(), dy.data(), dres.data(), dx.data(),
                              dw.data(), c.rows, c.C);
    EXPECT_TRUE(same_bits(dx, dx_ref));
    EXPECT_TRUE(same_bits(dw, dw_ref));
  }
}

// --- Bias + GELU --------------------------------------------------------------------------------

TEST(FusedBiasGelu, ForwardAndBackwardAreLinearBiasThenGeluBitwise) {
  // F = 1536 is 6L/384's MLP width; 100 is not a multiple of the column block.
  for (const auto& [rows, F] : {std::pair<std::int64_t, std::int64_t>{1024, 1536}, {3, 100}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " F " + std::to_string(F));
    const auto n = static_cast<std::size_t>(rows * F);
    const auto x = randn(n, "gelu.x", 2.0f), dy = randn(n, "gelu.dy");
    const auto b = randn(static_cast<std::size_t>(F), "gelu.b");
    const auto db0 = randn(static_cast<std::size_t>(F), "gelu.db0");
    // Unfused: the linear's bias add (the same loop as add_bias: row by row, += b), then GELU.
    std::vector<float> pre_ref = x, y_ref(n);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < F; ++j) pre_ref[static_cast<std::size_t>(r * F + j)] += b[j];
    }
    kernels::gelu_forward(pre_ref.data(), y_ref.data(), static_cast<std::int64_t>(n));
    std::vector<float> dx_ref(n), db_ref = db0;
    kernels::gelu_backward(pre_ref.data(), dy.data(), dx_ref.data(), static_cast<std::int64_t>(n));
    kernels::bias_backward(dx_ref.data(), db_ref.data(), rows, F);
    for (const int threads : {1, 2}) {
      kernels::set_num_threads(threads);
      SCOPED_TRACE("threads " + std::to_string(threads));
      std::vector<float> pre = x, y(n);
      kernels::bias_gelu_forward(pre.data(), b.data(), y.data(), rows, F);
      EXPECT_TRUE(same_bits(pre, pre_ref));
      EXPECT_TRUE(same_bits(y, y_ref));
      std::vector<float> d = dy, db = db0;  // in place, as GeluMlp calls it
      kernels::gelu_bias_backward(pre.data(), d.data(), d.data(), db.data(), rows, F);
      EXPECT_TRUE(same_bits(d, dx_ref));
      EXPECT_TRUE(same_bits(db, db_ref));
      std::vector<float> dx(n), db2 = db0;  // out of place: dy must stay untouched
      kernels::gelu_bias_backward(pre.data(), dy.data(), dx.data(), db2.data(), rows, F);
      EXPECT_TRUE(same_bits(dx, dx_ref));
      EXPECT_TRUE(same_bits(db2, db_ref));
    }
    kernels::set_num_threads(1);
  }
}

// --- Softmax statistics over the vocabulary ----------------------------------------------------

TEST(FusedCrossEntropy, OnePassStatsAreMaxThenSumExpBitwise) {
  for (const auto& [rows, V] : {std::pair<std::int64_t, std::int64_t>{1024, 65}, {5, 50257}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " V " + std::to_string(V));
    const auto n = static_cast<std::size_t>(rows * V);
    const auto logits = randn(n, "ce.logits", 4.0f);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < targets.size(); ++r) {
      targets[r] = static_cast<std::int32_t>((r * 7919) % static_cast<std::size_t>(V));
    }
    const auto m = static_cast<std::size_t>(rows);
    std::vector<float> max_ref(m), sum_ref(m), tgt_ref(m);
    kernels::vocab_shard_max(logits.data(), rows, V, V, max_ref.data());
    kernels::vocab_shard_sum_exp(logits.data(), max_ref.data(), targets.data(), 0, rows, V, V,
                                 sum_ref.data(), tgt_ref.data());
    for (const int threads : {1, 2}) {
      kernels::set_num_threads(threads);
      std::vector<float> mx(m), sum(m), tgt(m);
      kernels::vocab_softmax_stats(logits.data(), targets.data(), rows, V, mx.data(), sum.data(),
                                   tgt.data());
      EXPECT_TRUE(same_bits(mx, max_ref)) << "threads " << threads;
      EXPECT_TRUE(same_bits(sum, sum_ref));
      EXPECT_TRUE(same_bits(tgt, tgt_ref));
    }
    kernels::set_num_threads(1);
  }
}

// --- AdamW with the clipping folded in -------------------------------------------------------

TEST(FusedAdamW, GradScaleIsClipThenStepBitwise) {
  const std::size_t n = 100003;  // odd: the vector loop's remainder runs too
  const auto w0 = randn(n, "adam.w"), g = randn(n, "adam.g", 3.0f);
  const auto m0 = randn(n, "adam.m", 0.1f);
  auto v0 = randn(n, "adam.v", 0.1f);
  for (float& x : v0) x *= x;  // second moments are ≥ 0
  // A norm over the limit (clips) and one under it (coefficient exactly 1).
  for (const double norm : {7.5, 0.25}) {
    const float coef = clip_coefficient(norm, 1.0);
    EXPECT_EQ(coef == 1.0f, norm < 1.0) << norm;
    const kernels::AdamWParams hp{
        .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    std::vector<float> w_ref = w0, m_ref = m0, v_ref = v0, g_ref = g;
    if (coef != 1.0f) kernels::scale_inplace(g_ref.data(), coef, static_cast<std::int64_t>(n));
    kernels::adamw_step(w_ref, m_ref, v_ref, g_ref, hp, 7);
    for (const int threads : {1, 2}) {
      kernels::set_num_threads(threads);
      std::vector<float> w = w0, m = m0, v = v0;
      kernels::AdamWParams fused = hp;
      fused.grad_scale = coef;
      kernels::adamw_step(w, m, v, g, fused, 7);
      EXPECT_TRUE(same_bits(w, w_ref)) << "norm " << norm << " threads " << threads;
      EXPECT_TRUE(same_bits(m, m_ref));
      EXPECT_TRUE(same_bits(v, v_ref));
    }
    kernels::set_num_threads(1);
  }
  EXPECT_EQ(clip_coefficient(7.5, 0.0), 1.0f);  // max_norm ≤ 0: no clipping
}

TEST(FusedAdamW, AllTensorsInOneRegionAreEachTensorsStepBitwise) {
  // Sizes below and above the parallel grain, odd ones, one spanning a thread boundary: the
  // flat split cuts tensors anywhere (mid-vector too), which an element-wise update must not
  // notice. Weight decay differs per tensor, as between weights and biases.
  const std::vector<std::size_t> sizes{1, 17, 384, 16384, 40000, 65 * 128 + 3, 100003, 5};
  std::vector<std::vector<float>> w0, m0, v0, g;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::string tag = "adam.all." + std::to_string(k);
    w0.push_back(randn(sizes[k], tag + ".w"));
    m0.push_back(randn(sizes[k], tag + ".m", 0.1f));
    v0.push_back(randn(sizes[k], tag + ".v", 0.1f));
    for (float& x : v0.back()) x *= x;
    g.push_back(randn(sizes[k], tag + ".g", 3.0f));
  }
  const auto params = [](std::size_t k) {
    return kernels::AdamWParams{.lr = 3e-3f,
                                .beta1 = 0.9f,
                                .beta2 = 0.95f,
                                .eps = 1e-8f,
                                .weight_decay = k % 2 == 0 ? 0.1f : 0.0f,
                                .grad_scale = 0.5f};
  };
  kernels::set_num_threads(1);
  auto w_ref = w0, m_ref = m0, v_ref = v0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    kernels::adamw_step(w_ref[k], m_ref[k], v_ref[k], g[k], params(k), 4);
  }
  for (const int threads : {1, 2, 3}) {
    kernels::set_num_threads(threads);
    auto w = w0, m = m0, v = v0;
    std::vector<kernels::AdamWTensor> tensors;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      tensors.push_back({w[k], m[k], v[k], g[k], params(k)});
    kernels::adamw_step_all(tensors, 4);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_TRUE(same_bits(w[k], w_ref[k])) << "tensor " << k << " threads " << threads;
      EXPECT_TRUE(same_bits(m[k], m_ref[k])) << "tensor " << k << " threads " << threads;
      EXPECT_TRUE(same_bits(v[k], v_ref[k])) << "tensor " << k << " threads " << threads;
    }
  }
  kernels::set_num_threads(1);
}

TEST(FusedAdamW, ZeroingTheGradientInThePassKeepsTheStepBitwiseAndLeavesPlusZero) {
  // zero_g (the next step's zero_grad folded into the update) must not change w, m or v by a
  // bit, and must leave every gradient element +0.0f: in a flat split that cuts tensors
  // anywhere (sizes below and above the parallel grain, odd ones), with 1, 2 and 3 threads,
  // and with clipping's grad_scale ≠ 1 so that g is read through the product.
  const std::vector<std::size_t> sizes{1, 17, 40000, 65 * 128 + 3, 100003, 5};
  const auto params = kernels::AdamWParams{.lr = 3e-3f,
                                           .beta1 = 0.9f,
                                           .beta2 = 0.95f,
                                           .eps = 1e-8f,
                                           .weight_decay = 0.1f,
                                           .grad_scale = 0.75f};
  std::vector<std::vector<float>> w0, m0, v0, g0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::string tag = "adam.zero." + std::to_string(k);
    w0.push_back(randn(sizes[k], tag + ".w"));
    m0.push_back(randn(sizes[k], tag + ".m", 0.1f));
    v0.push_back(randn(sizes[k], tag + ".v", 0.1f));
    for (float& x : v0.back()) x *= x;
    g0.push_back(randn(sizes[k], tag + ".g", 3.0f));
    g0.back().front() = -0.0f;  // a −0 gradient must come out +0 too
  }
  auto w_ref = w0, m_ref = m0, v_ref = v0;
  kernels::set_num_threads(1);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    kernels::adamw_step(w_ref[k], m_ref[k], v_ref[k], g0[k], params, 3);
  }
  for (const int threads : {1, 2, 3}) {
    kernels::set_num_threads(threads);
    auto w = w0, m = m0, v = v0, g = g0;
    std::vector<kernels::AdamWTensor> tensors;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      tensors.push_back({w[k], m[k], v[k], g[k], params, g[k]});
    kernels::adamw_step_all(tensors, 3);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_TRUE(same_bits(w[k], w_ref[k])) << "tensor " << k << " threads " << threads;
      EXPECT_TRUE(same_bits(m[k], m_ref[k])) << "tensor " << k << " threads " << threads;
      EXPECT_TRUE(same_bits(v[k], v_ref[k])) << "tensor " << k << " threads " << threads;
      EXPECT_TRUE(same_bits(g[k], std::vector<float>(sizes[k], 0.0f)))
          << "tensor " << k << " threads " << threads;
    }
  }
  kernels::set_num_threads(1);
}

TEST(FusedAdamWDeathTest, ZeroingStorageOtherThanTheGradientIsRefused) {
  // zero_g must be g's own floats: any other span would zero memory the update never read.
  std::vector<float> w(8, 1.0f), m(8), v(8), g(8, 0.5f), other(8, 0.5f);
  const kernels::AdamWParams params{1e-3f, 0.9f, 0.99f, 1e-8f, 0.0f};
  const kernels::AdamWTensor wrong_storage{w, m, v, g, params, other};
  EXPECT_DEATH(kernels::adamw_step_all({&wrong_storage, 1}, 1),
               "zero_g must be empty or g's own 8 floats");
  const kernels::AdamWTensor wrong_size{w, m, v, g, params, std::span<float>(g).first(7)};
  EXPECT_DEATH(kernels::adamw_step_all({&wrong_size, 1}, 1),
               "zero_g must be empty or g's own 8 floats");
  EXPECT_EQ(other, std::vector<float>(8, 0.5f));
}

TEST(ZeroAll, ClearsEverySpanAndNothingElseWithAnyThreadCount) {
  // Byte sizes below and above the parallel grain, odd ones and ones a thread's cut lands in,
  // carved from one buffer with guard bytes between them: every span must read 0 after the
  // call and every guard byte must keep its value, with 1, 2 and 3 threads.
  const std::vector<std::size_t> sizes{1, 63, 4 * 384, 200000, 131075, 64 * 1025 + 7, 5, 300001};
  constexpr std::size_t kGuard = 13;
  const int saved = kernels::num_threads();
  std::size_t total = kGuard;
  for (const std::size_t n : sizes) total += n + kGuard;
  for (const int threads : {1, 2, 3}) {
    kernels::set_num_threads(threads);
    std::vector<std::byte> buffer(total);
    for (std::size_t i = 0; i < total; ++i) buffer[i] = static_cast<std::byte>(1 + i % 251);
    std::vector<std::span<std::byte>> spans;
    std::size_t at = kGuard;
    for (const std::size_t n : sizes) {
      spans.emplace_back(buffer.data() + at, n);
      at += n + kGuard;
    }
    kernels::zero_all(spans);
    std::size_t wrong = 0;
    at = 0;
    for (const std::size_t n : sizes) {
      for (std::size_t i = at; i < at + kGuard; ++i)
        wrong += buffer[i] != static_cast<std::byte>(1 + i % 251);
      at += kGuard;
      for (std::size_t i = at; i < at + n; ++i) wrong += buffer[i] != std::byte{0};
      at += n;
    }
    for (std::size_t i = at; i < total; ++i)
      wrong += buffer[i] != static_cast<std::byte>(1 + i % 251);
    EXPECT_EQ(wrong, 0u) << threads << " thread(s)";
  }
  kernels::set_num_threads(saved);
}

// --- Through TransformerBlock ------------------------------------------------------------------

// A stand-in for attention / MLP: y = scale·x + shift per element, with a parameter-free
// backward, so the test isolates the residual and norm plumbing.
class Affine final : public Module {
 public:
  Affine(float scale, float shift) : scale_(scale), shift_(shift) {}
  Tensor forward(const Tensor& x, const SequenceBatch& /*batch*/,
                 const MicroBatchContext& /*ctx*/) override {
    Tensor y = Tensor::empty(x.shape(), MemCategory::activations);
    for (std::int64_t i = 0; i < x.numel(); ++i) y.f32()[i] = scale_ * x.f32()[i] + shift_;
    return y;
  }
  Tensor backward(const Tensor& dy, const MicroBatchContext& /*ctx*/) override {
    Tensor dx = Tensor::empty(dy.shape(), MemCategory::activations);
    for (std::int64_t i = 0; i < dy.numel(); ++i) dx.f32()[i] = scale_ * dy.f32()[i];
    return dx;
  }
  ParameterList parameters() override { return {}; }
  void discard(const MicroBatchContext& /*ctx*/) override {}

 private:
  float scale_, shift_;
};

// Hides a norm's ResidualNorm interface: the block then adds the residuals itself (unfused).
class Opaque final : public Module {
 public:
  explicit Opaque(std::unique_ptr<Module> inner) : inner_(std::move(inner)) {}
  Tensor forward(const Tensor& x, const SequenceBatch& batch,
                 const MicroBatchContext& ctx) override {
    return inner_->forward(x, batch, ctx);
  }
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) override {
    return inner_->backward(dy, ctx);
  }
  ParameterList parameters() override { return inner_->parameters(); }
  void discard(const MicroBatchContext& ctx) override { inner_->discard(ctx); }

 private:
  std::unique_ptr<Module> inner_;
};

std::unique_ptr<Module> make_norm(bool rms, const std::string& name, std::int64_t C) {
  std::unique_ptr<Module> norm;
  if (rms) {
    norm = std::make_unique<RmsNorm>(name, test::records_table({test::norm_records(name, C, false)}),
                                     1e-6f);
  } else {
    norm = std::make_unique<LayerNorm>(name, test::records_table({test::norm_records(name, C, true)}),
                                       1e-5f);
  }
  for (Parameter* p : norm->parameters()) {  // not ones / zeros: every term of the formula counts
    const auto v = randn(static_cast<std::size_t>(p->value.numel()), p->name, 0.2f, 1.0f);
    std::memcpy(p->value.f32(), v.data(), v.size() * sizeof(float));
  }
  return norm;
}

struct BlockRun {
  std::vector<float> y, dx;
  std::vector<std::vector<float>> grads;
};

BlockRun run_block(bool rms, bool fused, std::int64_t rows, std::int64_t C) {
  auto n1 = make_norm(rms, "ln_1", C), n2 = make_norm(rms, "ln_2", C);
  if (!fused) {
    n1 = std::make_unique<Opaque>(std::move(n1));
    n2 = std::make_unique<Opaque>(std::move(n2));
  }
  TransformerBlock block(std::move(n1), std::make_unique<Affine>(0.7f, 0.1f), std::move(n2),
                         std::make_unique<Affine>(-1.3f, 0.2f));
  const auto n = static_cast<std::size_t>(rows * C);
  Tensor x = Tensor::empty({rows, C}, MemCategory::activations);
  const auto xv = randn(n, "block.x", 1.0f, 0.5f), dyv = randn(n, "block.dy");
  std::memcpy(x.f32(), xv.data(), n * sizeof(float));
  Tensor dy = Tensor::empty({rows, C}, MemCategory::activations);
  std::memcpy(dy.f32(), dyv.data(), n * sizeof(float));
  const Tensor y = block.forward(x, SequenceBatch{1, rows}, {});
  const Tensor dx = block.backward(dy, {});
  BlockRun out{{y.f32(), y.f32() + n}, {dx.f32(), dx.f32() + n}, {}};
  for (Parameter* p : block.parameters()) {
    out.grads.emplace_back(p->grad.f32(), p->grad.f32() + p->grad.numel());
  }
  return out;
}

TEST(FusedResidualNorm, TransformerBlockFusedEqualsUnfusedBitwise) {
  for (const bool rms : {false, true}) {
    for (const std::int64_t rows : {std::int64_t{5}, std::int64_t{256}}) {
      SCOPED_TRACE(std::string(rms ? "RMSNorm" : "LayerNorm") + " rows " + std::to_string(rows));
      const BlockRun fused = run_block(rms, true, rows, 96);
      const BlockRun plain = run_block(rms, false, rows, 96);
      EXPECT_TRUE(same_bits(fused.y, plain.y));
      EXPECT_TRUE(same_bits(fused.dx, plain.dx));
      ASSERT_EQ(fused.grads.size(), plain.grads.size());
      ASSERT_EQ(fused.grads.size(), rms ? 2u : 4u);
      for (std::size_t i = 0; i < fused.grads.size(); ++i) {
        EXPECT_TRUE(same_bits(fused.grads[i], plain.grads[i])) << "parameter " << i;
      }
    }
  }
}

}  // namespace
}  // namespace meshtrain
