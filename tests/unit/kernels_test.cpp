// tests/unit/kernels_test.cpp
//
// Tests of kernels/ (CPU): every backward against central finite differences of its own
// forward, every forward against a naive double-precision reference, GEMM against a triple
// loop, AdamW against a hand-written double-precision reference, and the non-GEMM kernels
// bitwise equal with 1 and 2 threads (their reductions are partitioned by data, not threads).
//
// Finite differences: L = Σ dy ∘ f(x) is accumulated in double from the kernel's f32
// outputs, and ∂L/∂x_i ≈ (L(x_i + h) − L(x_i − h)) / (x_i⁺ − x_i⁻), where x_i± are the f32
// values actually stored, so rounding x ± h does not enter the quotient. What remains is
// (a) truncation, O(h²·f‴), zero for the (bi)linear kernels, and (b) the f32 rounding of the
// outputs, ≈ √(outputs)·ε_f32·|y| / 2h, which is why h is not smaller.
#include "meshtrain/kernels/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/cpu/vector_math.h"

namespace meshtrain::kernels {
namespace {

constexpr std::uint64_t kSeed = 1234;
constexpr double kEpsF32 = std::numeric_limits<float>::epsilon();

std::vector<float> randn(std::size_t n, std::string_view name, float stddev = 1.0f,
                         float mean = 0.0f) {
  std::vector<float> v(n);
  fill_normal(v, kSeed, stream_of(name), 0, mean, stddev);
  return v;
}

double dot_double(std::span<const float> a, std::span<const float> b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

/// Central differences of loss() in every element of x (or in the elements listed in
/// `only`; the others are left at 0).
template <class Loss>
std::vector<double> numeric_grad(std::vector<float>& x, Loss&& loss, float h,
                                 const std::vector<std::size_t>* only = nullptr) {
  std::vector<double> g(x.size(), 0.0);
  std::vector<std::size_t> all;
  if (only == nullptr) {
    for (std::size_t i = 0; i < x.size(); ++i) all.push_back(i);
    only = &all;
  }
  for (const std::size_t i : *only) {
    const float saved = x[i];
    const float plus = saved + h;
    const float minus = saved - h;
    x[i] = plus;
    const double l_plus = loss();
    x[i] = minus;
    const double l_minus = loss();
    x[i] = saved;
    g[i] = (l_plus - l_minus) / (static_cast<double>(plus) - static_cast<double>(minus));
  }
  return g;
}

/// Every element within atol + rtol·|expected|; on failure reports the worst element.
void expect_all_near(std::span<const float> actual, std::span<const double> expected, double rtol,
                     double atol, std::string_view what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst_ratio = 0.0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(static_cast<double>(actual[i]) - expected[i]);
    const double ratio = err / (atol + rtol * std::abs(expected[i]));
    if (!(ratio <= worst_ratio)) {  // also catches NaN
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_LE(worst_ratio, 1.0) << what << ": worst element " << worst << " is " << actual[worst]
                              << ", expected " << expected[worst] << " (rtol " << rtol << ", atol "
                              << atol << ")";
}

std::vector<double> to_double(std::span<const float> v) { return {v.begin(), v.end()}; }

std::vector<float> minus(std::span<const float> a, std::span<const float> b) {
  std::vector<float> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

/// Runs body with 1 and then 2 threads and restores the previous count.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(num_threads()) {}
  ~ThreadCountGuard() { set_num_threads(saved_); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int saved_;
};

// ---------------------------------------------------------------------------------------------
// Threads

TEST(ThreadsKernel, SetNumThreadsIsVisible) {
  const ThreadCountGuard guard;
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
}

// ---------------------------------------------------------------------------------------------
// GEMM

std::vector<double> naive_gemm(const std::vector<float>& a, const std::vector<float>& b,
                               const std::vector<float>& c0, std::int64_t m, std::int64_t n,
                               std::int64_t k, bool ta, bool tb, double alpha, double beta,
                               std::vector<double>* magnitude) {
  std::vector<double> c(static_cast<std::size_t>(m * n));
  magnitude->assign(c.size(), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      double mag = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av = a[static_cast<std::size_t>(ta ? p * m + i : i * k + p)];
        const double bv = b[static_cast<std::size_t>(tb ? j * k + p : p * n + j)];
        s += av * bv;
        mag += std::abs(av * bv);
      }
      const std::size_t idx = static_cast<std::size_t>(i * n + j);
      c[idx] = alpha * s + beta * c0[idx];
      (*magnitude)[idx] = std::abs(alpha) * mag + std::abs(beta * c0[idx]);
    }
  }
  return c;
}

TEST(GemmKernel, MatchesNaiveForAllTransposesAlphaAndBeta) {
  struct Shape {
    std::int64_t m, n, k;
  };
  // Tiny and odd; GPT-like (lm_head backward); and odd sizes past oneDNN's blocking.
  for (const Shape s : {Shape{7, 5, 9}, Shape{65, 128, 384}, Shape{96, 130, 257}}) {
    const auto a = randn(static_cast<std::size_t>(s.m * s.k), "gemm.a");
    const auto b = randn(static_cast<std::size_t>(s.k * s.n), "gemm.b");
    const auto c0 = randn(static_cast<std::size_t>(s.m * s.n), "gemm.c");
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const float alpha : {1.0f, -0.75f}) {
          for (const float beta : {0.0f, 1.0f}) {
            std::vector<float> c = c0;
            gemm(a.data(), b.data(), c.data(), s.m, s.n, s.k, ta, tb, alpha, beta);
            std::vector<double> mag;
            const auto ref = naive_gemm(a, b, c0, s.m, s.n, s.k, ta, tb, alpha, beta, &mag);
            // Forward error bound of a dot product in any summation order,
            // |fl(Σ a·b) − Σ a·b| ≤ γ_k·Σ|a·b| with γ_k ≈ k·ε (Higham 2002, "Accuracy and
            // Stability of Numerical Algorithms", eq. 3.5), plus one rounding each for alpha
            // and the beta sum. A wrong transpose or a misplaced alpha is off by O(|c|).
            double worst = 0.0;
            for (std::size_t i = 0; i < c.size(); ++i) {
              const double bound = static_cast<double>(s.k + 2) * kEpsF32 * mag[i] + 1e-30;
              worst = std::max(worst, std::abs(c[i] - ref[i]) / bound);
            }
            EXPECT_LE(worst, 1.0) << "m=" << s.m << " n=" << s.n << " k=" << s.k
                                  << " trans_a=" << ta << " trans_b=" << tb << " alpha=" << alpha
                                  << " beta=" << beta;
          }
        }
      }
    }
  }
}

TEST(GemmKernel, CachedPrimitiveUsesEachCallsPointers) {
  const std::int64_t m = 4, n = 3, k = 5;
  const auto a1 = randn(20, "gemm.cache.a1");
  const auto a2 = randn(20, "gemm.cache.a2");
  const auto b = randn(15, "gemm.cache.b");
  std::vector<float> c1(12), c2(12);
  gemm(a1.data(), b.data(), c1.data(), m, n, k, false, false, 1.0f, 0.0f);
  gemm(a2.data(), b.data(), c2.data(), m, n, k, false, false, 1.0f, 0.0f);  // same key
  std::vector<double> mag;
  const std::vector<float> zeros(12, 0.0f);
  expect_all_near(c1, naive_gemm(a1, b, zeros, m, n, k, false, false, 1, 0, &mag), 1e-5, 1e-6,
                  "first call");
  expect_all_near(c2, naive_gemm(a2, b, zeros, m, n, k, false, false, 1, 0, &mag), 1e-5, 1e-6,
                  "second call, cached primitive");
}

TEST(GemmKernel, EmptyInnerDimensionIsAnEmptySum) {
  std::vector<float> c = {1.0f, 2.0f, 3.0f, 4.0f};
  gemm(nullptr, nullptr, c.data(), 2, 2, 0, false, false, 1.0f, 1.0f);
  EXPECT_EQ(c, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
  gemm(nullptr, nullptr, c.data(), 2, 2, 0, false, false, 1.0f, 0.0f);
  EXPECT_EQ(c, (std::vector<float>(4, 0.0f)));
}

// ---------------------------------------------------------------------------------------------
// Linear

TEST(LinearKernel, ForwardMatchesNaive) {
  const LinearDims d{6, 5, 4};
  const auto x = randn(30, "lin.x");
  const auto w = randn(20, "lin.w");
  const auto b = randn(4, "lin.b");
  std::vector<float> y(24), y_nobias(24);
  linear_forward(x.data(), w.data(), b.data(), y.data(), d);
  linear_forward(x.data(), w.data(), nullptr, y_nobias.data(), d);
  std::vector<double> ref(24), ref_nobias(24);
  for (int t = 0; t < 6; ++t) {
    for (int o = 0; o < 4; ++o) {
      double s = 0.0;
      for (int i = 0; i < 5; ++i) s += static_cast<double>(x[t * 5 + i]) * w[o * 5 + i];
      ref_nobias[t * 4 + o] = s;
      ref[t * 4 + o] = s + b[o];
    }
  }
  // 5-term dot products of O(1) values: error ≲ 7·ε·5 ≈ 4e-6 absolute.
  expect_all_near(y, ref, 1e-5, 1e-5, "y");
  expect_all_near(y_nobias, ref_nobias, 1e-5, 1e-5, "y without bias");
}

TEST(LinearKernel, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const LinearDims d{6, 5, 4};
  auto x = randn(30, "lin.x");
  auto w = randn(20, "lin.w");
  auto b = randn(4, "lin.b");
  const auto dy = randn(24, "lin.dy");
  std::vector<float> y(24);
  const auto loss = [&] {
    linear_forward(x.data(), w.data(), b.data(), y.data(), d);
    return dot_double(dy, y);
  };
  // Pre-filled gradients: dw and db must come out as old value + gradient.
  const auto dw0 = randn(20, "lin.dw0");
  const auto db0 = randn(4, "lin.db0");
  std::vector<float> dx(30, 123.0f), dw = dw0, db = db0;  // dx is overwritten
  linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), d);

  // L is bilinear in (x, w) and linear in b, so central differences have no truncation
  // error; what is left is f32 rounding of y (≈ 24 outputs · ε · |y| / 2h ≈ 1e-5 with h =
  // 0.05) and of dw − dw0 (ε·|dw0|). Measured max abs error 9e-6; 1e-4 leaves margin and
  // still catches any wrong term (errors of O(1)).
  const float h = 0.05f;
  expect_all_near(dx, numeric_grad(x, loss, h), 1e-4, 1e-4, "dx");
  expect_all_near(minus(dw, dw0), numeric_grad(w, loss, h), 1e-4, 1e-4, "dw (accumulated)");
  expect_all_near(minus(db, db0), numeric_grad(b, loss, h), 1e-4, 1e-4, "db (accumulated)");

  // dx = nullptr and db = nullptr are allowed and leave the rest unchanged.
  std::vector<float> dw_only = dw0;
  linear_backward(x.data(), w.data(), dy.data(), nullptr, dw_only.data(), nullptr, d);
  expect_all_near(dw_only, to_double(dw), 1e-6, 1e-6, "dw with dx = db = nullptr");
}

TEST(LinearKernel, GptShapeMatchesNaive) {
  // Large enough for the parallel bias loops (tokens·out ≥ the OpenMP grain) and oneDNN's
  // blocked kernels: the lm_head shape of the main job.
  const LinearDims d{768, 128, 65};
  const auto x = randn(768 * 128, "lin.big.x");
  const auto w = randn(65 * 128, "lin.big.w", 0.1f);
  const auto b = randn(65, "lin.big.b");
  const auto dy = randn(768 * 65, "lin.big.dy");
  std::vector<float> y(768 * 65), dx(768 * 128), dw(65 * 128, 0.0f), db(65, 0.0f);
  linear_forward(x.data(), w.data(), b.data(), y.data(), d);
  linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), d);
  std::vector<double> y_ref(y.size()), dx_ref(dx.size(), 0.0), dw_ref(dw.size(), 0.0),
      db_ref(db.size(), 0.0);
  for (int t = 0; t < 768; ++t) {
    for (int o = 0; o < 65; ++o) {
      double s = b[o];
      const double g = dy[t * 65 + o];
      for (int i = 0; i < 128; ++i) {
        s += static_cast<double>(x[t * 128 + i]) * w[o * 128 + i];
        dx_ref[t * 128 + i] += g * w[o * 128 + i];
        dw_ref[o * 128 + i] += g * x[t * 128 + i];
      }
      y_ref[t * 65 + o] = s;
      db_ref[o] += g;
    }
  }
  // Sums of up to 768 O(1) terms: typical f32 error √768·ε·√768 ≈ 1e-4 absolute on dw/db
  // (whose values are O(√768) ≈ 28), far less on y and dx. Measured: dw 8e-5, db 5e-5,
  // y 3e-6, dx 1e-6.
  expect_all_near(y, y_ref, 1e-4, 1e-4, "y");
  expect_all_near(dx, dx_ref, 1e-4, 1e-4, "dx");
  expect_all_near(dw, dw_ref, 1e-4, 1e-3, "dw");
  expect_all_near(db, db_ref, 1e-4, 1e-3, "db");
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

struct LayerNormCase {
  std::int64_t rows;
  std::int64_t C;
};

TEST(LayerNormKernel, ForwardMatchesNaive) {
  for (const LayerNormCase lc : {LayerNormCase{4, 8}, LayerNormCase{3, 70}}) {
    const std::size_t n = static_cast<std::size_t>(lc.rows * lc.C);
    // Mean 3 ≫ std 1 exercises the two-pass variance.
    const auto x = randn(n, "ln.x", 1.0f, 3.0f);
    const auto wt = randn(static_cast<std::size_t>(lc.C), "ln.w", 0.5f, 1.0f);
    const auto bs = randn(static_cast<std::size_t>(lc.C), "ln.b");
    std::vector<float> y(n), mean(static_cast<std::size_t>(lc.rows)),
        rstd(static_cast<std::size_t>(lc.rows));
    const float eps = 1e-5f;
    layernorm_forward(x.data(), wt.data(), bs.data(), y.data(), mean.data(), rstd.data(), lc.rows,
                      lc.C, eps);
    std::vector<double> y_ref(n), mean_ref(mean.size()), rstd_ref(rstd.size());
    for (std::int64_t r = 0; r < lc.rows; ++r) {
      double mu = 0.0, var = 0.0;
      for (std::int64_t c = 0; c < lc.C; ++c) mu += x[static_cast<std::size_t>(r * lc.C + c)];
      mu /= static_cast<double>(lc.C);
      for (std::int64_t c = 0; c < lc.C; ++c) {
        const double dv = x[static_cast<std::size_t>(r * lc.C + c)] - mu;
        var += dv * dv;
      }
      var /= static_cast<double>(lc.C);
      const double rs = 1.0 / std::sqrt(var + eps);
      mean_ref[static_cast<std::size_t>(r)] = mu;
      rstd_ref[static_cast<std::size_t>(r)] = rs;
      for (std::int64_t c = 0; c < lc.C; ++c) {
        const std::size_t i = static_cast<std::size_t>(r * lc.C + c);
        y_ref[i] =
            (x[i] - mu) * rs * wt[static_cast<std::size_t>(c)] + bs[static_cast<std::size_t>(c)];
      }
    }
    // Sums over ≤ 70 elements of values ≈ 3: relative error ≲ 70·ε ≈ 1e-5 on mean and
    // variance, which y inherits with |y| = O(1).
    expect_all_near(mean, mean_ref, 1e-5, 1e-6, "mean");
    expect_all_near(rstd, rstd_ref, 1e-5, 1e-6, "rstd");
    expect_all_near(y, y_ref, 1e-5, 1e-5, "y");
  }
}

TEST(LayerNormKernel, BackwardMatchesFiniteDifferencesAndAccumulates) {
  // C = 70 crosses the 64-column block of the dweight/dbias reduction.
  for (const LayerNormCase lc : {LayerNormCase{4, 8}, LayerNormCase{3, 70}}) {
    const std::size_t n = static_cast<std::size_t>(lc.rows * lc.C);
    const std::size_t cn = static_cast<std::size_t>(lc.C);
    auto x = randn(n, "ln.x", 1.0f, 3.0f);
    auto wt = randn(cn, "ln.w", 0.5f, 1.0f);
    auto bs = randn(cn, "ln.b");
    const auto dy = randn(n, "ln.dy");
    const float eps = 1e-5f;
    std::vector<float> y(n), mean(static_cast<std::size_t>(lc.rows)),
        rstd(static_cast<std::size_t>(lc.rows));
    const auto loss = [&] {
      layernorm_forward(x.data(), wt.data(), bs.data(), y.data(), mean.data(), rstd.data(), lc.rows,
                        lc.C, eps);
      return dot_double(dy, y);
    };
    loss();  // mean, rstd of the unperturbed x for backward
    const auto dw0 = randn(cn, "ln.dw0");
    const auto db0 = randn(cn, "ln.db0");
    std::vector<float> dx(n, 7.0f), dw = dw0, db = db0;
    layernorm_backward(x.data(), wt.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                       dw.data(), db.data(), lc.rows, lc.C);

    // L is linear in weight and bias (no truncation error) and smooth in x with curvature
    // O(rstd²) = O(1): truncation ≈ h²·|f‴|/6 ≈ 1e-4 at h = 2e-2. The larger noise is the
    // forward's own rounding: perturbing one x re-rounds the row's mean, a 70-term sum of
    // values ≈ 3, which shifts all 70 outputs coherently, ≈ C·ε·|x|/2h ≈ 1e-4 in ∂L/∂x.
    // (h = 1e-2 measured 3e-4, h = 4e-2 measured 1e-4 for C = 70: rounding dominates.)
    // Measured max abs error at h = 2e-2: 1.3e-4; tolerance 1e-3 + 1e-3 relative, still far
    // below a missing term of the dx formula (O(0.1–1)).
    const float h = 2e-2f;
    expect_all_near(dx, numeric_grad(x, loss, h), 1e-3, 1e-3, "dx");
    expect_all_near(minus(dw, dw0), numeric_grad(wt, loss, h), 1e-3, 1e-3, "dweight");
    expect_all_near(minus(db, db0), numeric_grad(bs, loss, h), 1e-3, 1e-3, "dbias");

    // Without bias: dbias = nullptr is allowed; dweight still accumulates.
    std::vector<float> dw2 = dw0;
    layernorm_backward(x.data(), wt.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                       dw2.data(), nullptr, lc.rows, lc.C);
    expect_all_near(dw2, to_double(dw), 1e-6, 1e-6, "dweight with dbias = nullptr");
  }
}

// ---------------------------------------------------------------------------------------------
// GELU

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / std::acos(-1.0));
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

TEST(GeluKernel, ForwardMatchesFormulaAndBackwardMatchesFiniteDifferences) {
  auto x = randn(200, "gelu.x", 2.0f);  // spans the curved region |x| ≲ 3 and both tails
  const auto dy = randn(200, "gelu.dy");
  std::vector<float> y(200), dx(200);
  gelu_forward(x.data(), y.data(), 200);
  std::vector<double> y_ref(200);
  for (std::size_t i = 0; i < 200; ++i) y_ref[i] = gelu_ref(x[i]);
  // A handful of f32 operations and one tanhf (≤ 2 ulp): a few ε relative, except that
  // 1 + tanh(u) cancels for x ≪ 0, leaving an absolute error ≈ ε·|x| (same formula, and the
  // same cancellation, as PyTorch's).
  expect_all_near(y, y_ref, 1e-6, 1e-6, "y");

  gelu_backward(x.data(), dy.data(), dx.data(), 200);
  const auto loss = [&] {
    gelu_forward(x.data(), y.data(), 200);
    return dot_double(dy, y);
  };
  // Each y_i depends on x_i alone, so the only rounding in L's difference is that of one
  // output (≈ ε·|y|/2h ≈ 1e-5) plus truncation h²·|gelu‴|/6 ≲ 2e-5 at h = 1e-2 (|gelu‴| ≲ 1).
  // Measured max abs error 3.4e-5; tolerance 2e-4.
  expect_all_near(dx, numeric_grad(x, loss, 1e-2f), 2e-4, 2e-4, "dx");
}

// ---------------------------------------------------------------------------------------------
// Attention

/// Naive causal attention in double with the full T×T probability matrix.
void naive_attention(const std::vector<float>& qkv, const AttentionDims& d,
                     std::vector<double>* out, std::vector<double>* lse) {
  const std::int64_t T = d.seq_len, H = d.heads, hd = d.head_dim, C = H * hd;
  out->assign(static_cast<std::size_t>(d.batch * T * C), 0.0);
  lse->assign(static_cast<std::size_t>(d.batch * H * T), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const auto at = [&](std::int64_t b, std::int64_t t, std::int64_t col) {
    return static_cast<double>(qkv[static_cast<std::size_t>((b * T + t) * 3 * C + col)]);
  };
  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<double> s(static_cast<std::size_t>(T * T));
      for (std::int64_t i = 0; i < T; ++i) {
        for (std::int64_t j = 0; j < T; ++j) {
          double v = -std::numeric_limits<double>::infinity();  // causal mask
          if (j <= i) {
            v = 0.0;
            for (std::int64_t c = 0; c < hd; ++c)
              v += at(b, i, h * hd + c) * at(b, j, C + h * hd + c);
            v *= scale;
          }
          s[static_cast<std::size_t>(i * T + j)] = v;
        }
      }
      for (std::int64_t i = 0; i < T; ++i) {  // softmax of row i, materialised
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < T; ++j)
          m = std::max(m, s[static_cast<std::size_t>(i * T + j)]);
        double z = 0.0;
        for (std::int64_t j = 0; j < T; ++j)
          z += std::exp(s[static_cast<std::size_t>(i * T + j)] - m);
        (*lse)[static_cast<std::size_t>((b * H + h) * T + i)] = m + std::log(z);
        for (std::int64_t j = 0; j < T; ++j) {
          const double p = std::exp(s[static_cast<std::size_t>(i * T + j)] - m) / z;
          for (std::int64_t c = 0; c < hd; ++c) {
            (*out)[static_cast<std::size_t>((b * T + i) * C + h * hd + c)] +=
                p * at(b, j, 2 * C + h * hd + c);
          }
        }
      }
    }
  }
}

TEST(AttentionKernel, ForwardMatchesNaiveFullSoftmax) {
  for (const AttentionDims d : {AttentionDims{2, 5, 2, 4}, AttentionDims{2, 64, 3, 32}}) {
    const std::int64_t C = d.heads * d.head_dim;
    const auto qkv = randn(static_cast<std::size_t>(d.batch * d.seq_len * 3 * C), "attn.qkv");
    std::vector<float> out(static_cast<std::size_t>(d.batch * d.seq_len * C));
    std::vector<float> lse(static_cast<std::size_t>(d.batch * d.heads * d.seq_len));
    attention_forward(qkv.data(), out.data(), lse.data(), d);
    std::vector<double> out_ref, lse_ref;
    naive_attention(qkv, d, &out_ref, &lse_ref);
    // Scores are 32-term dots (relative error ≲ 32·ε), exp amplifies an absolute score error
    // δ into a relative probability error δ, and out averages O(1) values: ≈ 1e-5 at worst.
    expect_all_near(out, out_ref, 1e-4, 2e-5, "out");
    expect_all_near(lse, lse_ref, 1e-5, 1e-5, "lse");
  }
}

TEST(AttentionKernel, BackwardMatchesFiniteDifferences) {
  struct Case {
    AttentionDims d;
    std::size_t sampled;  // 0: every element of qkv
  };
  // The small case checks every element; the T = 64, head_dim = 32 case (the main job's)
  // checks a deterministic sample of q, k and v entries, since each FD needs two forwards.
  for (const Case tc : {Case{{2, 5, 2, 4}, 0}, Case{{1, 64, 2, 32}, 48}}) {
    const AttentionDims d = tc.d;
    const std::int64_t C = d.heads * d.head_dim;
    const std::size_t n_qkv = static_cast<std::size_t>(d.batch * d.seq_len * 3 * C);
    const std::size_t n_out = static_cast<std::size_t>(d.batch * d.seq_len * C);
    auto qkv = randn(n_qkv, "attn.qkv");
    const auto dout = randn(n_out, "attn.dout");
    std::vector<float> out(n_out), lse(static_cast<std::size_t>(d.batch * d.heads * d.seq_len));
    const auto loss = [&] {
      attention_forward(qkv.data(), out.data(), lse.data(), d);
      return dot_double(dout, out);
    };
    loss();
    std::vector<float> dqkv(n_qkv, 5.0f);  // overwritten
    attention_backward(qkv.data(), out.data(), lse.data(), dout.data(), dqkv.data(), d);

    std::vector<std::size_t> idx;
    if (tc.sampled != 0) {
      for (std::size_t s = 0; s < tc.sampled; ++s) {
        idx.push_back(
            static_cast<std::size_t>(philox_u64(kSeed, stream_of("attn.sample"), s) % n_qkv));
      }
    }
    const auto numeric = numeric_grad(qkv, loss, 1e-2f, tc.sampled != 0 ? &idx : nullptr);
    std::vector<float> got;
    std::vector<double> want;
    for (std::size_t i = 0; i < n_qkv; ++i) {
      if (tc.sampled != 0 && std::find(idx.begin(), idx.end(), i) == idx.end()) continue;
      got.push_back(dqkv[i]);
      want.push_back(numeric[i]);
    }
    // Softmax is smooth with O(1) curvature in scores that are O(1) here: truncation
    // ≈ h²/6 ≈ 2e-5 at h = 1e-2; rounding of L ≈ √outputs·ε·|out|/2h ≈ 1e-4 for 4096
    // outputs. Measured max abs error 2.4e-5 (small) and 1.1e-4 (T = 64); tolerance 1e-3 is
    // still 100× below what a wrong D_i or a dropped scale produces.
    expect_all_near(got, want, 1e-3, 1e-3, "dqkv");
  }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

TEST(CrossEntropyKernel, ForwardMatchesNaiveLogSoftmaxAndIsStable) {
  const std::int64_t rows = 5, V = 7;
  auto logits = randn(35, "ce.logits", 2.0f);
  const std::vector<std::int32_t> targets = {0, 6, 3, 3, 1};
  std::vector<float> losses(5), lse(5);
  cross_entropy_forward(logits.data(), targets.data(), losses.data(), lse.data(), rows, V);
  std::vector<double> loss_ref(5), lse_ref(5);
  for (std::size_t r = 0; r < 5; ++r) {
    double z = 0.0;  // naive: no max subtraction (fine in double for |logit| ≲ 700)
    for (std::size_t j = 0; j < 7; ++j) z += std::exp(static_cast<double>(logits[r * 7 + j]));
    lse_ref[r] = std::log(z);
    loss_ref[r] =
        -(static_cast<double>(logits[r * 7 + static_cast<std::size_t>(targets[r])]) - lse_ref[r]);
  }
  // One exp/log chain over 7 terms: a few ε relative on O(1) values.
  expect_all_near(losses, loss_ref, 1e-5, 1e-6, "losses");
  expect_all_near(lse, lse_ref, 1e-5, 1e-6, "lse");

  // Logits shifted by +1000 overflow a naive f32 exp; with the max subtracted the loss is
  // unchanged (the shift cancels exactly in lse − logit, up to rounding of 1000 + z, whose
  // ulp is 6e-5; measured 4.9e-5).
  for (float& v : logits) v += 1000.0f;
  std::vector<float> shifted(5), shifted_lse(5);
  cross_entropy_forward(logits.data(), targets.data(), shifted.data(), shifted_lse.data(), rows, V);
  expect_all_near(shifted, loss_ref, 0.0, 2e-4, "losses with logits + 1000");
}

TEST(CrossEntropyKernel, BackwardMatchesFiniteDifferencesAndMayAliasLogits) {
  const std::int64_t rows = 5, V = 7;
  auto logits = randn(35, "ce.logits", 2.0f);
  const std::vector<std::int32_t> targets = {0, 6, 3, 3, 1};
  const float scale = 1.0f / static_cast<float>(rows);  // mean loss
  std::vector<float> losses(5), lse(5);
  const auto loss = [&] {
    cross_entropy_forward(logits.data(), targets.data(), losses.data(), lse.data(), rows, V);
    double s = 0.0;
    for (const float l : losses) s += l;
    return s * scale;
  };
  loss();
  std::vector<float> dlogits(35, 9.0f);
  cross_entropy_backward(logits.data(), lse.data(), targets.data(), scale, dlogits.data(), rows, V);
  // Smooth, curvature ≤ 1/4 per logit: truncation ≈ h²/24 ≈ 4e-6 at h = 1e-2; rounding of
  // 5 losses ≈ ε·|loss|/2h ≈ 1e-5. Measured max abs error 4.5e-6; tolerance 1e-4 (the
  // gradients themselves are O(0.1)).
  expect_all_near(dlogits, numeric_grad(logits, loss, 1e-2f), 1e-4, 1e-4, "dlogits");

  loss();  // numeric_grad's last forward left lse of a perturbed row behind
  std::vector<float> in_place = logits;
  cross_entropy_backward(in_place.data(), lse.data(), targets.data(), scale, in_place.data(), rows,
                         V);
  EXPECT_EQ(in_place, dlogits) << "dlogits aliasing logits must give the same bits";
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(EmbeddingKernel, ForwardGathersAndBackwardAccumulatesRepeatedIds) {
  const std::int64_t table_rows = 6, C = 70, rows = 8;  // C = 70 crosses a 64-column block
  auto table = randn(static_cast<std::size_t>(table_rows * C), "emb.table");
  const std::vector<std::int32_t> ids = {3, 1, 3, 0, 5, 3, 1, 2};
  const auto dout = randn(static_cast<std::size_t>(rows * C), "emb.dout");
  std::vector<float> out(static_cast<std::size_t>(rows * C));
  embedding_forward(ids.data(), table.data(), out.data(), rows, C);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    for (std::size_t c = 0; c < static_cast<std::size_t>(C); ++c) {
      ASSERT_EQ(out[r * 70 + c], table[static_cast<std::size_t>(ids[r]) * 70 + c]) << r << "," << c;
    }
  }

  const auto dtable0 = randn(table.size(), "emb.dtable0");
  std::vector<float> dtable = dtable0;
  embedding_backward(ids.data(), dout.data(), dtable.data(), rows, C);
  const auto loss = [&] {
    embedding_forward(ids.data(), table.data(), out.data(), rows, C);
    return dot_double(dout, out);
  };
  // L is linear in the table: no truncation; rounding only in the 560-term dot (≈ 1e-6
  // after dividing by 2h) and in dtable − dtable0. Row 3 is used three times, row 4 never.
  expect_all_near(minus(dtable, dtable0), numeric_grad(table, loss, 0.05f), 1e-5, 1e-5,
                  "dtable (accumulated)");
  for (std::size_t c = 0; c < 70; ++c) {
    const float want3 =
        ((dtable0[3 * 70 + c] + dout[0 * 70 + c]) + dout[2 * 70 + c]) + dout[5 * 70 + c];
    EXPECT_EQ(dtable[3 * 70 + c], want3) << "row 3 sums rows 0, 2, 5 in order, column " << c;
    EXPECT_EQ(dtable[4 * 70 + c], dtable0[4 * 70 + c]) << "unused row 4, column " << c;
  }
}

// ---------------------------------------------------------------------------------------------
// Element-wise

TEST(ElementwiseKernel, AddScaleAndSumSquares) {
  const std::int64_t n = 100003;  // above the OpenMP grain, not a multiple of any block
  const auto a = randn(static_cast<std::size_t>(n), "ew.a");
  const auto b = randn(static_cast<std::size_t>(n), "ew.b");
  std::vector<float> out(a.size());
  add(a.data(), b.data(), out.data(), n);
  std::vector<float> y = a;
  add_inplace(y.data(), b.data(), n);
  std::vector<float> s = a;
  scale_inplace(s.data(), -0.5f, n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(out[i], a[i] + b[i]) << i;
    ASSERT_EQ(y[i], a[i] + b[i]) << i;
    ASSERT_EQ(s[i], a[i] * -0.5f) << i;
  }
  long double ref = 0.0L;
  for (const float v : a) ref += static_cast<long double>(v) * v;
  // Double accumulation over 1e5 terms: relative error ≲ 1e5·2⁻⁵³ ≈ 1e-11.
  EXPECT_NEAR(sum_squares(a.data(), n), static_cast<double>(ref), 1e-10 * static_cast<double>(ref));
  EXPECT_EQ(sum_squares(a.data(), 0), 0.0);
  EXPECT_DOUBLE_EQ(sum_squares(a.data(), 3), static_cast<double>(a[0]) * a[0] +
                                                 static_cast<double>(a[1]) * a[1] +
                                                 static_cast<double>(a[2]) * a[2]);
}

// ---------------------------------------------------------------------------------------------
// Thread-count independence of everything but GEMM (oneDNN may split K differently).

TEST(ParallelKernel, NonGemmKernelsGiveTheSameBitsWithOneAndTwoThreads) {
  const ThreadCountGuard guard;
  const std::int64_t tokens = 768, C = 128, V = 65;
  const AttentionDims ad{12, 64, 4, 32};
  const auto x = randn(static_cast<std::size_t>(tokens * C), "par.x");
  const auto wt = randn(static_cast<std::size_t>(C), "par.w", 0.2f, 1.0f);
  const auto dy = randn(static_cast<std::size_t>(tokens * C), "par.dy");
  const auto qkv = randn(static_cast<std::size_t>(tokens * 3 * C), "par.qkv");
  const auto logits = randn(static_cast<std::size_t>(tokens * V), "par.logits");
  std::vector<std::int32_t> ids(static_cast<std::size_t>(tokens));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i * 7 % 65);

  const auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<std::vector<float>> r;
    std::vector<float> y(x.size()), mean(768), rstd(768), dx(x.size()), dw(128, 0.0f),
        db(128, 0.0f);
    layernorm_forward(x.data(), wt.data(), wt.data(), y.data(), mean.data(), rstd.data(), tokens, C,
                      1e-5f);
    layernorm_backward(x.data(), wt.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                       dw.data(), db.data(), tokens, C);
    r.insert(r.end(), {y, dx, dw, db});
    std::vector<float> g(x.size()), dg(x.size());
    gelu_forward(x.data(), g.data(), tokens * C);
    gelu_backward(x.data(), dy.data(), dg.data(), tokens * C);
    r.insert(r.end(), {g, dg});
    std::vector<float> out(x.size()), lse(static_cast<std::size_t>(12 * 4 * 64)), dqkv(qkv.size());
    attention_forward(qkv.data(), out.data(), lse.data(), ad);
    attention_backward(qkv.data(), out.data(), lse.data(), dy.data(), dqkv.data(), ad);
    r.insert(r.end(), {out, lse, dqkv});
    std::vector<float> losses(768), clse(768), dl(logits.size());
    std::vector<std::int32_t> targets(ids);
    cross_entropy_forward(logits.data(), targets.data(), losses.data(), clse.data(), tokens, V);
    cross_entropy_backward(logits.data(), clse.data(), targets.data(), 1.0f / 768, dl.data(),
                           tokens, V);
    r.insert(r.end(), {losses, clse, dl});
    std::vector<float> dtable(static_cast<std::size_t>(65 * C), 0.0f);
    embedding_backward(ids.data(), dy.data(), dtable.data(), tokens, C);
    r.push_back(dtable);
    std::vector<float> wa = x, ma(x.size(), 0.0f), va(x.size(), 0.0f);
    adamw_step(wa, ma, va, dy, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, 1);
    r.insert(r.end(), {wa, ma, va});
    r.push_back({static_cast<float>(sum_squares(dy.data(), tokens * C))});
    // A linear layer's db only: its dx/dw go through GEMM.
    std::vector<float> ldb(128, 0.0f), ldw(128 * 128, 0.0f);
    linear_backward(x.data(), x.data(), dy.data(), nullptr, ldw.data(), ldb.data(),
                    {tokens, 128, 128});
    r.push_back(ldb);
    return r;
  };
  const auto one = run(1);
  const auto two = run(2);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "output #" << i;
}

// ---------------------------------------------------------------------------------------------
// AdamW

TEST(AdamWKernel, ThreeStepsMatchDoublePrecisionReference) {
  const std::size_t n = 37;
  for (const float wd : {0.1f, 0.0f}) {
    const AdamWParams p{3e-2f, 0.9f, 0.95f, 1e-8f, wd};
    auto w = randn(n, "adamw.w");
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    std::vector<double> wr(w.begin(), w.end()), mr(n, 0.0), vr(n, 0.0);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const auto g = randn(n, "adamw.g" + std::to_string(step), 0.1f);
      adamw_step(w, m, v, g, p, step);
      // torch.optim.AdamW, written out in double.
      const double b1 = p.beta1, b2 = p.beta2, lr = p.lr;
      const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
      const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
      for (std::size_t i = 0; i < n; ++i) {
        wr[i] -= lr * static_cast<double>(p.weight_decay) * wr[i];
        mr[i] = b1 * mr[i] + (1.0 - b1) * g[i];
        vr[i] = b2 * vr[i] + (1.0 - b2) * g[i] * g[i];
        const double mhat = mr[i] / bc1;
        const double vhat = vr[i] / bc2;
        wr[i] -= lr * mhat / (std::sqrt(vhat) + static_cast<double>(p.eps));
      }
    }
    // Each step is a few f32 operations per element: relative error a few ε per step on m, v
    // and the update, plus ε·|w| from the subtraction; where m or v nearly cancel, the
    // absolute error of its terms (ε·(1−β1)·|g| ≈ 1e-9, ε·(1−β2)·g² ≈ 1e-11) remains.
    // Measured: w 3e-7, m 2e-9, v 3e-10. A missed bias correction or decay changes w by
    // O(lr) = 3e-2, m and v by O(|g|), O(g²).
    const std::string tag = wd != 0.0f ? " (decay)" : " (no decay)";
    expect_all_near(w, wr, 1e-6, 1e-6, "w" + tag);
    expect_all_near(m, mr, 1e-6, 1e-8, "m" + tag);
    expect_all_near(v, vr, 1e-6, 1e-10, "v" + tag);
  }
}

}  // namespace
}  // namespace meshtrain::kernels

// The vectorisable exp used by GELU and the attention softmax (kernels/cpu/vector_math.h).

namespace meshtrain::kernels {
namespace {

TEST(ExpApproxKernel, WithinTwoUlpOfDoublePrecisionExpOverTheUsedRange) {
  // Every 1/64 from −87 to 88: relative error against exp in double. fp32 eps is 1.19e-7;
  // 2.4e-7 = 2 ulp. Measured max when written: see the printed value.
  double worst = 0.0;
  for (int i = -87 * 64; i <= 88 * 64; ++i) {
    const float x = static_cast<float>(i) / 64.0f;
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(static_cast<double>(cpu::exp_approx(x)) - ref) / ref);
  }
  std::printf("exp_approx max relative error %.3g\n", worst);
  EXPECT_LE(worst, 2.4e-7);
  // Clamped ends: far below gives a tiny positive number, far above a finite large one.
  EXPECT_LT(cpu::exp_approx(-1000.0f), 1e-37f);
  EXPECT_GE(cpu::exp_approx(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isfinite(cpu::exp_approx(1000.0f)));
}

}  // namespace
}  // namespace meshtrain::kernels
