// tests/unit/kernels/kernels_test.cpp
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
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/cpu/vec.h"
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
  // C = 70: an odd width, split unevenly over the threads' column ranges of dweight/dbias.
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
  // A handful of f32 operations, one exp (measured < 1 ulp) and one division: a few ε. The
  // kernel forms ½(1 + tanh u) as 1/(1 + e^(−2u)), which does not cancel for x ≪ 0 as
  // PyTorch's 1 + tanh(u) does (an absolute error ≈ ε·|x| there).
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

TEST(GeluKernel, AnElementsResultDoesNotDependOnItsPositionAndNaNPropagates) {
  // The kernels run whole vectors and one partial tail vector: an element alone (n = 1, the
  // tail path) must give the bits it gets inside a long array (the whole-vector path).
  const std::int64_t n = 203;
  auto x = randn(static_cast<std::size_t>(n), "gelu.pos.x", 3.0f);
  const auto dy = randn(static_cast<std::size_t>(n), "gelu.pos.dy");
  x[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(x.size()), dx(x.size());
  gelu_forward(x.data(), y.data(), n);
  gelu_backward(x.data(), dy.data(), dx.data(), n);
  for (std::size_t i = 0; i < x.size(); ++i) {
    float yi = 0.0f, dxi = 0.0f;
    gelu_forward(&x[i], &yi, 1);
    gelu_backward(&x[i], &dy[i], &dxi, 1);
    if (i == 5) {
      EXPECT_TRUE(std::isnan(y[i]) && std::isnan(yi) && std::isnan(dx[i]) && std::isnan(dxi));
      continue;
    }
    EXPECT_EQ(std::bit_cast<std::uint32_t>(yi), std::bit_cast<std::uint32_t>(y[i]))
        << "x[" << i << "]";
    EXPECT_EQ(std::bit_cast<std::uint32_t>(dxi), std::bit_cast<std::uint32_t>(dx[i]))
        << "x[" << i << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// Grouped-query attention

std::size_t zu(std::int64_t i) { return static_cast<std::size_t>(i); }

/// Dims and row strides of a GQA test whose q, k, v live in their own buffers. The strides are
/// wider than the heads, so a kernel that reads or writes outside the head columns is caught.
struct GqaCase {
  GqaDims d;
  std::int64_t q_stride;
  std::int64_t kv_stride;
  std::int64_t tokens() const { return d.batch * d.seq_len; }
  std::size_t q_size() const { return zu(tokens() * q_stride); }
  std::size_t kv_size() const { return zu(tokens() * kv_stride); }
  std::size_t out_size() const { return zu(tokens() * d.heads * d.head_dim); }
  std::size_t lse_size() const { return zu(d.batch * d.heads * d.seq_len); }
};

GqaCase padded_case(const GqaDims& d) {
  return {d, d.heads * d.head_dim + 3, d.kv_heads * d.head_dim + 5};
}

/// Naive GQA in double with the full T×T probability matrix. Forward, and backward when dout
/// is given, straight from the definitions (P = softmax(S), S = q·kᵀ/√d, O = P·v):
///   dv_j = Σ_i P_ij·dO_i,  dP_ij = dO_i·v_j,  dS_ij = P_ij·(dP_ij − Σ_l P_il·dP_il),
///   dq_i = Σ_j dS_ij·k_j/√d,  dk_j = Σ_i dS_ij·q_i/√d,
/// with dk, dv summed over the query heads sharing a kv head. dq, dk, dv come back in the
/// strided layouts of q, k, v (0 outside the head columns).
struct NaiveGqa {
  std::vector<double> out, lse, dq, dk, dv;
};

NaiveGqa naive_gqa(const QkvRows& in, const GqaDims& d, const float* dout) {
  const std::int64_t B = d.batch, T = d.seq_len, H = d.heads, hd = d.head_dim, C = H * hd;
  const std::int64_t group = d.heads / d.kv_heads;
  const std::int64_t qs = in.q_stride, kvs = in.kv_stride;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  NaiveGqa r;
  r.out.assign(zu(B * T * C), 0.0);
  r.lse.assign(zu(B * H * T), 0.0);
  r.dq.assign(zu(B * T * qs), 0.0);
  r.dk.assign(zu(B * T * kvs), 0.0);
  r.dv.assign(zu(B * T * kvs), 0.0);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t qo = b * T * qs + h * hd;              // q_i[c] at qo + i·qs + c
      const std::int64_t kvo = b * T * kvs + (h / group) * hd;  // k_j[c] at kvo + j·kvs + c
      const std::int64_t oo = b * T * C + h * hd;               // out_i[c] at oo + i·C + c
      const auto q = [&](std::int64_t i, std::int64_t c) { return double{in.q[qo + i * qs + c]}; };
      const auto k = [&](std::int64_t j, std::int64_t c) {
        return double{in.k[kvo + j * kvs + c]};
      };
      const auto v = [&](std::int64_t j, std::int64_t c) {
        return double{in.v[kvo + j * kvs + c]};
      };
      std::vector<double> p(zu(T * T), 0.0);
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> s(zu(i + 1));
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {  // causal: keys 0..i
          double dot = 0.0;
          for (std::int64_t c = 0; c < hd; ++c) dot += q(i, c) * k(j, c);
          s[zu(j)] = dot * scale;
          m = std::max(m, s[zu(j)]);
        }
        double z = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) z += std::exp(s[zu(j)] - m);
        r.lse[zu((b * H + h) * T + i)] = m + std::log(z);
        for (std::int64_t j = 0; j <= i; ++j) {
          p[zu(i * T + j)] = std::exp(s[zu(j)] - m) / z;
          for (std::int64_t c = 0; c < hd; ++c)
            r.out[zu(oo + i * C + c)] += p[zu(i * T + j)] * v(j, c);
        }
      }
      if (dout == nullptr) continue;
      const auto dO = [&](std::int64_t i, std::int64_t c) { return double{dout[oo + i * C + c]}; };
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> dp(zu(i + 1));
        double D = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t c = 0; c < hd; ++c) dot += dO(i, c) * v(j, c);
          dp[zu(j)] = dot;
          D += p[zu(i * T + j)] * dot;
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const double pij = p[zu(i * T + j)];
          const double ds = pij * (dp[zu(j)] - D) * scale;
          for (std::int64_t c = 0; c < hd; ++c) {
            r.dq[zu(qo + i * qs + c)] += ds * k(j, c);
            r.dk[zu(kvo + j * kvs + c)] += ds * q(i, c);
            r.dv[zu(kvo + j * kvs + c)] += pij * dO(i, c);
          }
        }
      }
    }
  }
  return r;
}

/// The `width` head columns of each of `rows` rows of a row-strided buffer, packed.
template <class T>
std::vector<T> head_columns(std::span<const T> buf, std::int64_t rows, std::int64_t stride,
                            std::int64_t width) {
  std::vector<T> packed;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < width; ++c) packed.push_back(buf[zu(r * stride + c)]);
  }
  return packed;
}

/// True when every column at or past `width` of every row still holds `fill`.
bool padding_untouched(std::span<const float> buf, std::int64_t rows, std::int64_t stride,
                       std::int64_t width, float fill) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = width; c < stride; ++c) {
      if (buf[zu(r * stride + c)] != fill) return false;
    }
  }
  return true;
}

/// GPT-2's fused c_attn output: q, k, v are the column ranges [0, C), [C, 2C), [2C, 3C) of
/// each 3C-wide row of one buffer, one kv head per query head (kv_heads = heads).
QkvRows fused_rows(const float* qkv, std::int64_t C) {
  return {qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C};
}
QkvGradRows fused_grad_rows(float* dqkv, std::int64_t C) {
  return {dqkv, dqkv + C, dqkv + 2 * C, 3 * C, 3 * C};
}

TEST(GqaAttentionKernel, FusedQkvForwardMatchesNaiveFullSoftmax) {
  for (const GqaDims d : {GqaDims{2, 5, 2, 2, 4}, GqaDims{2, 64, 3, 3, 32}}) {
    const std::int64_t C = d.heads * d.head_dim;
    const auto qkv = randn(zu(d.batch * d.seq_len * 3 * C), "attn.qkv");
    std::vector<float> out(zu(d.batch * d.seq_len * C));
    std::vector<float> lse(zu(d.batch * d.heads * d.seq_len));
    gqa_attention_forward(fused_rows(qkv.data(), C), out.data(), lse.data(), d);
    const NaiveGqa ref = naive_gqa(fused_rows(qkv.data(), C), d, nullptr);
    // Scores are 32-term dots (relative error ≲ 32·ε), exp amplifies an absolute score error
    // δ into a relative probability error δ, and out averages O(1) values: ≈ 1e-5 at worst.
    expect_all_near(out, ref.out, 1e-4, 2e-5, "out");
    expect_all_near(lse, ref.lse, 1e-5, 1e-5, "lse");
  }
}

TEST(GqaAttentionKernel, FusedQkvBackwardMatchesFiniteDifferences) {
  struct Case {
    GqaDims d;
    std::size_t sampled;  // 0: every element of qkv
  };
  // The small case checks every element; the T = 64, head_dim = 32 case (the main job's)
  // checks a deterministic sample of q, k and v entries, since each FD needs two forwards.
  for (const Case tc : {Case{{2, 5, 2, 2, 4}, 0}, Case{{1, 64, 2, 2, 32}, 48}}) {
    const GqaDims d = tc.d;
    const std::int64_t C = d.heads * d.head_dim;
    const std::size_t n_qkv = zu(d.batch * d.seq_len * 3 * C);
    const std::size_t n_out = zu(d.batch * d.seq_len * C);
    auto qkv = randn(n_qkv, "attn.qkv");
    const auto dout = randn(n_out, "attn.dout");
    std::vector<float> out(n_out), lse(zu(d.batch * d.heads * d.seq_len));
    const auto loss = [&] {
      gqa_attention_forward(fused_rows(qkv.data(), C), out.data(), lse.data(), d);
      return dot_double(dout, out);
    };
    loss();
    std::vector<float> dqkv(n_qkv, 5.0f);  // overwritten: every column is a head column
    gqa_attention_backward(fused_rows(qkv.data(), C), out.data(), lse.data(), dout.data(),
                           fused_grad_rows(dqkv.data(), C), d);

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

TEST(GqaAttentionKernel, ForwardMatchesNaiveFullSoftmaxForEveryGrouping) {
  // heads = 4 with kv_heads = 4 (multi-head), 2 (groups of 2) and 1 (multi-query); small and
  // GPT-shaped (T = 64, head_dim = 32); q, k, v in their own buffers with padded strides.
  for (const std::int64_t kv : {4, 2, 1}) {
    for (const GqaDims d : {GqaDims{2, 5, 4, kv, 4}, GqaDims{1, 64, 4, kv, 32}}) {
      const GqaCase g = padded_case(d);
      const auto q = randn(g.q_size(), "gqa.q");
      const auto k = randn(g.kv_size(), "gqa.k");
      const auto v = randn(g.kv_size(), "gqa.v");
      const QkvRows in{q.data(), k.data(), v.data(), g.q_stride, g.kv_stride};
      std::vector<float> out(g.out_size()), lse(g.lse_size());
      gqa_attention_forward(in, out.data(), lse.data(), d);
      const NaiveGqa ref = naive_gqa(in, d, nullptr);
      // As FusedQkvForwardMatchesNaiveFullSoftmax: 32-term score dots, exp turns an absolute
      // score error into a relative probability error, out averages O(1) values.
      const std::string tag =
          " (T=" + std::to_string(d.seq_len) + " kv_heads=" + std::to_string(kv) + ")";
      expect_all_near(out, ref.out, 1e-4, 2e-5, "out" + tag);
      expect_all_near(lse, ref.lse, 1e-5, 1e-5, "lse" + tag);
    }
  }
}

TEST(GqaAttentionKernel, BackwardMatchesFiniteDifferencesAndTheDoubleReference) {
  for (const std::int64_t kv : {4, 2, 1}) {
    const GqaDims d{2, 5, 4, kv, 4};
    const GqaCase g = padded_case(d);
    auto q = randn(g.q_size(), "gqa.q");
    auto k = randn(g.kv_size(), "gqa.k");
    auto v = randn(g.kv_size(), "gqa.v");
    const auto dout = randn(g.out_size(), "gqa.dout");
    const QkvRows in{q.data(), k.data(), v.data(), g.q_stride, g.kv_stride};
    std::vector<float> out(g.out_size()), lse(g.lse_size());
    const auto loss = [&] {
      gqa_attention_forward(in, out.data(), lse.data(), d);
      return dot_double(dout, out);
    };
    loss();
    // Sentinels: the head columns are overwritten, the padding columns must keep them.
    const float fill = 7.0f;
    std::vector<float> dq(g.q_size(), fill), dk(g.kv_size(), fill), dv(g.kv_size(), fill);
    gqa_attention_backward(in, out.data(), lse.data(), dout.data(),
                           {dq.data(), dk.data(), dv.data(), g.q_stride, g.kv_stride}, d);
    const NaiveGqa ref = naive_gqa(in, d, dout.data());

    const std::string tag = " (kv_heads=" + std::to_string(kv) + ")";
    const std::int64_t rows = g.tokens();
    const std::int64_t qw = d.heads * d.head_dim, kvw = d.kv_heads * d.head_dim;
    EXPECT_TRUE(padding_untouched(dq, rows, g.q_stride, qw, fill)) << "dq padding" << tag;
    EXPECT_TRUE(padding_untouched(dk, rows, g.kv_stride, kvw, fill)) << "dk padding" << tag;
    EXPECT_TRUE(padding_untouched(dv, rows, g.kv_stride, kvw, fill)) << "dv padding" << tag;
    const auto cols = [&](const std::vector<float>& x, std::int64_t stride, std::int64_t w) {
      return head_columns<float>(x, rows, stride, w);
    };
    const auto cols_d = [&](const std::vector<double>& x, std::int64_t stride, std::int64_t w) {
      return head_columns<double>(x, rows, stride, w);
    };
    // Against the analytic gradient in double: the kernel's f32 rounding only, a few ε on
    // O(1) values (measured max abs error 5.9e-7).
    expect_all_near(cols(dq, g.q_stride, qw), cols_d(ref.dq, g.q_stride, qw), 1e-5, 1e-5,
                    "dq vs double" + tag);
    expect_all_near(cols(dk, g.kv_stride, kvw), cols_d(ref.dk, g.kv_stride, kvw), 1e-5, 1e-5,
                    "dk vs double" + tag);
    expect_all_near(cols(dv, g.kv_stride, kvw), cols_d(ref.dv, g.kv_stride, kvw), 1e-5, 1e-5,
                    "dv vs double" + tag);
    // Against central differences of the kernel's own forward, tolerance and error budget as
    // FusedQkvBackwardMatchesFiniteDifferences (padding columns: both sides give 0 there, the
    // FD because out does not depend on them).
    const float h = 1e-2f;
    expect_all_near(cols(dq, g.q_stride, qw), cols_d(numeric_grad(q, loss, h), g.q_stride, qw),
                    1e-3, 1e-3, "dq vs FD" + tag);
    expect_all_near(cols(dk, g.kv_stride, kvw), cols_d(numeric_grad(k, loss, h), g.kv_stride, kvw),
                    1e-3, 1e-3, "dk vs FD" + tag);
    expect_all_near(cols(dv, g.kv_stride, kvw), cols_d(numeric_grad(v, loss, h), g.kv_stride, kvw),
                    1e-3, 1e-3, "dv vs FD" + tag);
  }
}

TEST(GqaAttentionKernel, BackwardMatchesTheDoubleReferenceAtGptShape) {
  for (const std::int64_t kv : {4, 2, 1}) {
    const GqaDims d{2, 64, 4, kv, 32};
    const GqaCase g = padded_case(d);
    const auto q = randn(g.q_size(), "gqa.q");
    const auto k = randn(g.kv_size(), "gqa.k");
    const auto v = randn(g.kv_size(), "gqa.v");
    const auto dout = randn(g.out_size(), "gqa.dout");
    const QkvRows in{q.data(), k.data(), v.data(), g.q_stride, g.kv_stride};
    std::vector<float> out(g.out_size()), lse(g.lse_size());
    gqa_attention_forward(in, out.data(), lse.data(), d);
    std::vector<float> dq(g.q_size(), 7.0f), dk(g.kv_size(), 7.0f), dv(g.kv_size(), 7.0f);
    gqa_attention_backward(in, out.data(), lse.data(), dout.data(),
                           {dq.data(), dk.data(), dv.data(), g.q_stride, g.kv_stride}, d);
    const NaiveGqa ref = naive_gqa(in, d, dout.data());
    const std::int64_t rows = g.tokens();
    const std::int64_t qw = d.heads * d.head_dim, kvw = d.kv_heads * d.head_dim;
    // dk and dv sum over up to T·group = 256 (row, head) terms of O(1), dq over T: f32
    // rounding ≈ √terms·ε·|term| plus exp_approx and the score dots' ≈ 32·ε relative.
    // Measured max abs error 4.3e-6 (dv, kv_heads = 1); 1e-4 is 20× that and still far
    // below a dropped or doubled group member (O(0.1–1)).
    const std::string tag = " (kv_heads=" + std::to_string(kv) + ")";
    expect_all_near(head_columns<float>(dq, rows, g.q_stride, qw),
                    head_columns<double>(ref.dq, rows, g.q_stride, qw), 1e-4, 1e-4, "dq" + tag);
    expect_all_near(head_columns<float>(dk, rows, g.kv_stride, kvw),
                    head_columns<double>(ref.dk, rows, g.kv_stride, kvw), 1e-4, 1e-4, "dk" + tag);
    expect_all_near(head_columns<float>(dv, rows, g.kv_stride, kvw),
                    head_columns<double>(ref.dv, rows, g.kv_stride, kvw), 1e-4, 1e-4, "dv" + tag);
  }
}

TEST(GqaAttentionKernel, FusedBufferIsTheStridedCaseBitwise) {
  // One projection output per token, [q | k | v] with widths heads·hd, kv_heads·hd,
  // kv_heads·hd (Llama's fused qkv; GPT-2's c_attn when kv_heads = heads), against the same
  // values copied into three contiguous arrays: the arithmetic must not depend on where the
  // rows live.
  for (const std::int64_t kv : {4, 2, 1}) {
    const GqaDims d{2, 64, 4, kv, 32};
    const std::int64_t rows = d.batch * d.seq_len, C = d.heads * d.head_dim;
    const std::int64_t KVC = d.kv_heads * d.head_dim, W = C + 2 * KVC;
    const auto fused = randn(zu(rows * W), "gqa.fused");
    const auto dout = randn(zu(rows * C), "gqa.dout");
    std::vector<float> q, k, v;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = fused.data() + r * W;
      q.insert(q.end(), row, row + C);
      k.insert(k.end(), row + C, row + C + KVC);
      v.insert(v.end(), row + C + KVC, row + W);
    }
    const QkvRows in_fused{fused.data(), fused.data() + C, fused.data() + C + KVC, W, W};
    const QkvRows in_sep{q.data(), k.data(), v.data(), C, KVC};
    std::vector<float> out_f(zu(rows * C)), lse_f(zu(d.batch * d.heads * d.seq_len));
    std::vector<float> out_s(out_f.size()), lse_s(lse_f.size());
    gqa_attention_forward(in_fused, out_f.data(), lse_f.data(), d);
    gqa_attention_forward(in_sep, out_s.data(), lse_s.data(), d);
    const std::string tag = " (kv_heads=" + std::to_string(kv) + ")";
    EXPECT_EQ(out_f, out_s) << "out" << tag;
    EXPECT_EQ(lse_f, lse_s) << "lse" << tag;

    std::vector<float> dfused(fused.size(), 3.0f);  // every column is a head column
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    gqa_attention_backward(in_fused, out_f.data(), lse_f.data(), dout.data(),
                           {dfused.data(), dfused.data() + C, dfused.data() + C + KVC, W, W}, d);
    gqa_attention_backward(in_sep, out_s.data(), lse_s.data(), dout.data(),
                           {dq.data(), dk.data(), dv.data(), C, KVC}, d);
    std::vector<float> dq_f, dk_f, dv_f;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = dfused.data() + r * W;
      dq_f.insert(dq_f.end(), row, row + C);
      dk_f.insert(dk_f.end(), row + C, row + C + KVC);
      dv_f.insert(dv_f.end(), row + C + KVC, row + W);
    }
    EXPECT_EQ(dq_f, dq) << "dq" << tag;
    EXPECT_EQ(dk_f, dk) << "dk" << tag;
    EXPECT_EQ(dv_f, dv) << "dv" << tag;
  }
}

// ---------------------------------------------------------------------------------------------
// RoPE

/// Hugging Face's LlamaRotaryEmbedding angle for pair i, in float32 as torch computes it
/// (inv_freq = 1 / θ^(arange(0, d, 2) / d), then pos · inv_freq), returned as double.
double hf_rope_angle(std::int32_t pos, std::int64_t i, std::int64_t head_dim, float theta) {
  const float inv_freq =
      1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return static_cast<double>(static_cast<float>(pos) * inv_freq);
}

TEST(RopeKernel, PositionZeroIsIdentityAndHandCheckedAngles) {
  // Position 0: angle 0, cos 1, sin 0, every element unchanged to the bit.
  auto x = randn(3 * 16, "rope.x0");
  const auto x0 = x;
  const std::vector<std::int32_t> zeros(3, 0);
  rope_apply(x.data(), 16, zeros.data(), 3, 2, 8, 10000.0f, false);
  EXPECT_EQ(x, x0);

  // head_dim 4, θ = 10000: pair 0 (elements 0, 2) has inv_freq 1, pair 1 (elements 1, 3)
  // inv_freq 10000^(−1/2) = 0.01. At position 100 the angles are 100 rad and 1 rad; the unit
  // vectors (1, 0) of each pair turn into (cos a, sin a):
  //   cos 100 = 0.86231887228768389, sin 100 = −0.50636564110975879,
  //   cos 1 = 0.54030230586813977,   sin 1 = 0.84147098480789651.
  // (0.01f = 0.01 − 2.2e-10 and 0.01f·100 rounds to exactly 1.0f; what remains is cosf/sinf's
  // rounding, measured 2.9e-8.)
  std::vector<float> y = {1.0f, 1.0f, 0.0f, 0.0f};
  const std::vector<std::int32_t> pos100 = {100};
  rope_apply(y.data(), 4, pos100.data(), 1, 1, 4, 10000.0f, false);
  expect_all_near(y,
                  std::vector<double>{0.86231887228768389, 0.54030230586813977,
                                      -0.50636564110975879, 0.84147098480789651},
                  0.0, 2e-7, "position 100, head_dim 4");
  // The second element of a pair turns the other way: (0, 1) → (−sin a, cos a).
  std::vector<float> z = {0.0f, 0.0f, 1.0f, 1.0f};
  rope_apply(z.data(), 4, pos100.data(), 1, 1, 4, 10000.0f, false);
  expect_all_near(z,
                  std::vector<double>{0.50636564110975879, -0.84147098480789651,
                                      0.86231887228768389, 0.54030230586813977},
                  0.0, 2e-7, "position 100, second elements");
}

TEST(RopeKernel, MatchesHuggingFaceFormulaAndInverseIsTheBackward) {
  // 3 heads of 8 in rows 2 floats wider than the heads (the q part of a fused row, say);
  // positions up to 4095 (where the float32 angle matters) and Llama 2 / Llama 3 θ.
  const std::int64_t rows = 6, heads = 3, hd = 8, stride = heads * hd + 2;
  const std::vector<std::int32_t> positions = {0, 1, 5, 17, 100, 4095};
  for (const float theta : {10000.0f, 500000.0f}) {
    auto x = randn(zu(rows * stride), "rope.x");
    const auto x_in = x;
    rope_apply(x.data(), stride, positions.data(), rows, heads, hd, theta, false);
    std::vector<double> ref(x.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = heads * hd; c < stride; ++c)
        ref[zu(r * stride + c)] = x_in[zu(r * stride + c)];
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t i = 0; i < hd / 2; ++i) {
          const std::size_t lo = zu(r * stride + h * hd + i), hi = lo + zu(hd / 2);
          const double a = hf_rope_angle(positions[zu(r)], i, hd, theta);
          ref[lo] = x_in[lo] * std::cos(a) - x_in[hi] * std::sin(a);
          ref[hi] = x_in[hi] * std::cos(a) + x_in[lo] * std::sin(a);
        }
      }
    }
    // cosf/sinf of the same float angle (≤ 1 ulp each) and two f32 products and a sum: a
    // few ε on O(1) values. The padding columns come back unchanged (atol covers them: 0).
    const std::string tag = " (theta=" + std::to_string(static_cast<int>(theta)) + ")";
    expect_all_near(x, ref, 0.0, 5e-7, "rotated" + tag);
    EXPECT_TRUE(padding_untouched(minus(x, x_in), rows, stride, heads * hd, 0.0f))
        << "padding" << tag;

    // Inverse undoes forward: rotation by a then −a, two roundings of O(1) values.
    rope_apply(x.data(), stride, positions.data(), rows, heads, hd, theta, true);
    expect_all_near(x, to_double(x_in), 0.0, 1e-6, "inverse(forward(x))" + tag);

    // The inverse is the backward: L = dy·R(x) is linear in x, ∂L/∂x = Rᵀ·dy = R⁻¹·dy.
    // Central differences of a linear function have no truncation error; the rounding of L
    // (≈ 6·26 outputs · ε / 2h) is ≈ 1e-5 at h = 0.05.
    const auto dy = randn(x.size(), "rope.dy");
    std::vector<float> dx = dy;
    rope_apply(dx.data(), stride, positions.data(), rows, heads, hd, theta, true);
    std::vector<float> y(x.size());
    x = x_in;
    const auto loss = [&] {
      y = x;
      rope_apply(y.data(), stride, positions.data(), rows, heads, hd, theta, false);
      return dot_double(dy, y);
    };
    expect_all_near(head_columns<float>(dx, rows, stride, heads * hd),
                    head_columns<double>(numeric_grad(x, loss, 0.05f), rows, stride, heads * hd),
                    1e-4, 1e-4, "inverse vs FD" + tag);
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

/// rstd and y of RMSNorm in double.
void naive_rmsnorm(const std::vector<float>& x, const std::vector<float>& w, std::int64_t rows,
                   std::int64_t C, double eps, std::vector<double>* y, std::vector<double>* rstd) {
  y->assign(x.size(), 0.0);
  rstd->assign(zu(rows), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double ms = 0.0;
    for (std::int64_t c = 0; c < C; ++c) ms += double{x[zu(r * C + c)]} * x[zu(r * C + c)];
    const double rs = 1.0 / std::sqrt(ms / static_cast<double>(C) + eps);
    (*rstd)[zu(r)] = rs;
    for (std::int64_t c = 0; c < C; ++c) (*y)[zu(r * C + c)] = x[zu(r * C + c)] * rs * w[zu(c)];
  }
}

TEST(RmsNormKernel, ForwardMatchesNaive) {
  for (const LayerNormCase lc : {LayerNormCase{4, 8}, LayerNormCase{3, 70}}) {
    const std::size_t n = zu(lc.rows * lc.C);
    const auto x = randn(n, "rms.x", 1.0f, 0.5f);
    const auto wt = randn(zu(lc.C), "rms.w", 0.5f, 1.0f);
    std::vector<float> y(n), rstd(zu(lc.rows));
    rmsnorm_forward(x.data(), wt.data(), y.data(), rstd.data(), lc.rows, lc.C, 1e-5f);
    std::vector<double> y_ref, rstd_ref;
    naive_rmsnorm(x, wt, lc.rows, lc.C, 1e-5, &y_ref, &rstd_ref);
    // mean(x²) in double: rstd carries one f32 rounding (plus the f32 eps, exact here), y
    // two more products: ≲ 3 ε relative.
    expect_all_near(rstd, rstd_ref, 2e-7, 0.0, "rstd");
    expect_all_near(y, y_ref, 4e-7, 1e-7, "y");
  }
}

TEST(RmsNormKernel, BackwardMatchesFiniteDifferencesAndAccumulates) {
  // C = 70: an odd width, split unevenly over the threads' column ranges of dweight.
  for (const LayerNormCase lc : {LayerNormCase{4, 8}, LayerNormCase{3, 70}}) {
    const std::size_t n = zu(lc.rows * lc.C);
    const std::size_t cn = zu(lc.C);
    auto x = randn(n, "rms.x", 1.0f, 0.5f);
    auto wt = randn(cn, "rms.w", 0.5f, 1.0f);
    const auto dy = randn(n, "rms.dy");
    const float eps = 1e-5f;
    std::vector<float> y(n), rstd(zu(lc.rows));
    const auto loss = [&] {
      rmsnorm_forward(x.data(), wt.data(), y.data(), rstd.data(), lc.rows, lc.C, eps);
      return dot_double(dy, y);
    };
    loss();
    const auto dw0 = randn(cn, "rms.dw0");
    std::vector<float> dx(n, 7.0f), dw = dw0;
    rmsnorm_backward(x.data(), wt.data(), rstd.data(), dy.data(), dx.data(), dw.data(), lc.rows,
                     lc.C);

    // Analytic reference in double: dx = rstd·(g − x·rstd²·mean(g∘x)), g = dy∘w;
    // dweight = Σ_r dy∘x·rstd.
    std::vector<double> dx_ref(n), dw_ref(cn, 0.0);
    for (std::int64_t r = 0; r < lc.rows; ++r) {
      double ms = 0.0, gx = 0.0;
      for (std::int64_t c = 0; c < lc.C; ++c) {
        const std::size_t i = zu(r * lc.C + c);
        ms += double{x[i]} * x[i];
        gx += double{dy[i]} * wt[zu(c)] * x[i];
      }
      const double rs = 1.0 / std::sqrt(ms / static_cast<double>(lc.C) + eps);
      const double k = rs * rs * gx / static_cast<double>(lc.C);
      for (std::int64_t c = 0; c < lc.C; ++c) {
        const std::size_t i = zu(r * lc.C + c);
        dx_ref[i] = rs * (double{dy[i]} * wt[zu(c)] - x[i] * k);
        dw_ref[zu(c)] += double{dy[i]} * x[i] * rs;
      }
    }
    // A few f32 roundings on O(1) values (the ≤ 4-row dweight sums add ≤ 4 more).
    expect_all_near(dx, dx_ref, 1e-5, 1e-6, "dx vs double");
    expect_all_near(minus(dw, dw0), dw_ref, 1e-5, 1e-6, "dweight vs double (accumulated)");

    // Smooth in x with curvature O(rstd²) = O(1): truncation ≈ h²/6 ≈ 7e-5 at h = 2e-2, and
    // perturbing one x re-rounds the row's rstd, which moves all C outputs coherently
    // (≈ C·ε·|y| / 2h ≈ 2e-4 for C = 70). L is linear in the weight. Measured max abs error
    // 5.2e-4 (C = 8, where truncation grows with rstd³) and 4.8e-5 (C = 70); same tolerance
    // as LayerNormKernel's backward.
    const float h = 2e-2f;
    expect_all_near(dx, numeric_grad(x, loss, h), 1e-3, 1e-3, "dx vs FD");
    expect_all_near(minus(dw, dw0), numeric_grad(wt, loss, h), 1e-3, 1e-3, "dweight vs FD");
  }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

TEST(SwigluKernel, ForwardAndBackwardMatchDoublePrecisionAndMayAlias) {
  // gate over ±12 (σ's tails and the dsilu zero near g = −1.28) plus exact points.
  const std::size_t n = 4003;
  auto gate = randn(n, "swiglu.gate", 4.0f);
  gate[0] = 0.0f;
  gate[1] = -30.0f;
  gate[2] = 30.0f;
  auto up = randn(n, "swiglu.up");
  const auto dout = randn(n, "swiglu.dout");
  const std::int64_t ni = static_cast<std::int64_t>(n);
  std::vector<float> out(n), dgate(n), dup(n);
  swiglu_forward(gate.data(), up.data(), out.data(), ni);
  swiglu_backward(gate.data(), up.data(), dout.data(), dgate.data(), dup.data(), ni);
  std::vector<double> out_ref(n), dgate_ref(n), dup_ref(n), dgate_mag(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
    out_ref[i] = g * s * up[i];
    dgate_ref[i] = s * (1.0 + g * (1.0 - s)) * up[i] * dout[i];
    dup_ref[i] = g * s * dout[i];
    // σ + g·σ(1 − σ) is a sum of two terms that cancel near g ≈ −1.28: each term's own
    // rounding is the error to expect there.
    dgate_mag[i] = (s + std::abs(g) * s * (1.0 - s)) * std::abs(up[i] * dout[i]);
  }
  // Relative error in units of ε: exp_approx_vec (measured < 1 ulp, ExpApproxKernel), then
  // ≤ 5 f32 operations.
  double worst_out = 0.0, worst_dup = 0.0, worst_dgate = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto rel = [](double got, double want, double mag) {
      return mag == 0.0 ? std::abs(got) : std::abs(got - want) / (mag * kEpsF32);
    };
    worst_out = std::max(worst_out, rel(out[i], out_ref[i], std::abs(out_ref[i])));
    worst_dup = std::max(worst_dup, rel(dup[i], dup_ref[i], std::abs(dup_ref[i])));
    worst_dgate = std::max(worst_dgate, rel(dgate[i], dgate_ref[i], dgate_mag[i]));
  }
  std::printf("swiglu max error in ulp: out %.2f, dup %.2f, dgate %.2f (of its terms)\n", worst_out,
              worst_dup, worst_dgate);
  EXPECT_LE(worst_out, 4.0);
  EXPECT_LE(worst_dup, 4.0);
  EXPECT_LE(worst_dgate, 6.0);

  // Central differences of the kernel's forward (each output depends on its own inputs).
  std::vector<float> y(n);
  const auto loss = [&] {
    swiglu_forward(gate.data(), up.data(), y.data(), ni);
    return dot_double(dout, y);
  };
  // silu″ ≤ 0.5: truncation ≈ h²/6·|silu‴| ≲ 2e-5 at h = 1e-2, rounding ε·|y|/2h ≲ 1e-4 for
  // |y| ≲ 12; L is linear in up.
  expect_all_near(dgate, numeric_grad(gate, loss, 1e-2f), 2e-4, 2e-4, "dgate vs FD");
  expect_all_near(dup, numeric_grad(up, loss, 1e-2f), 2e-4, 2e-4, "dup vs FD");

  // dgate, dup aliasing gate, up: the same bits.
  std::vector<float> g2 = gate, u2 = up;
  swiglu_backward(g2.data(), u2.data(), dout.data(), g2.data(), u2.data(), ni);
  EXPECT_EQ(g2, dgate);
  EXPECT_EQ(u2, dup);
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel cross-entropy

/// Losses and lse of logits [rows, V] in double, straight from the definition
/// loss_r = log Σ_j exp(z_rj) − z_r,target: no max subtraction (fine in double for |z| ≲ 700).
void naive_cross_entropy(const std::vector<float>& logits, const std::vector<std::int32_t>& targets,
                         std::int64_t V, std::vector<double>* loss, std::vector<double>* lse) {
  const std::size_t rows = targets.size();
  loss->assign(rows, 0.0);
  lse->assign(rows, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    double z = 0.0;
    for (std::size_t j = 0; j < zu(V); ++j) z += std::exp(double{logits[r * zu(V) + j]});
    (*lse)[r] = std::log(z);
    (*loss)[r] = (*lse)[r] - double{logits[r * zu(V) + zu(targets[r])]};
  }
}

/// One shard holding the whole vocabulary (first = 0, valid = V_local = V), its pieces combined
/// as the layer does (parallel/tp/vocab_parallel.cpp, in f32): lse = max + log(sum_exp),
/// loss = lse − target_logit. losses [rows], lse [rows] overwritten.
void one_shard_cross_entropy(const float* logits, const std::int32_t* targets, std::int64_t rows,
                             std::int64_t V, float* losses, float* lse) {
  std::vector<float> sum_exp(zu(rows)), target_logit(zu(rows));
  vocab_shard_max(logits, rows, V, V, lse);
  vocab_shard_sum_exp(logits, lse, targets, 0, rows, V, V, sum_exp.data(), target_logit.data());
  for (std::size_t r = 0; r < zu(rows); ++r) {
    lse[r] += std::log(sum_exp[r]);
    losses[r] = lse[r] - target_logit[r];
  }
}

TEST(VocabShardCrossEntropyKernel, OneShardMatchesNaiveLogSoftmaxAndIsStable) {
  const std::int64_t rows = 5, V = 7;
  auto logits = randn(35, "ce.logits", 2.0f);
  const std::vector<std::int32_t> targets = {0, 6, 3, 3, 1};
  std::vector<float> losses(5), lse(5);
  one_shard_cross_entropy(logits.data(), targets.data(), rows, V, losses.data(), lse.data());
  std::vector<double> loss_ref, lse_ref;
  naive_cross_entropy(logits, targets, V, &loss_ref, &lse_ref);
  // One exp/log chain over 7 terms: a few ε relative on O(1) values.
  expect_all_near(losses, loss_ref, 1e-5, 1e-6, "losses");
  expect_all_near(lse, lse_ref, 1e-5, 1e-6, "lse");

  // Logits shifted by +1000 overflow a naive f32 exp; with the max subtracted the loss is
  // unchanged (the shift cancels exactly in lse − logit, up to rounding of 1000 + z, whose
  // ulp is 6e-5).
  for (float& v : logits) v += 1000.0f;
  std::vector<float> shifted(5), shifted_lse(5);
  one_shard_cross_entropy(logits.data(), targets.data(), rows, V, shifted.data(),
                          shifted_lse.data());
  expect_all_near(shifted, loss_ref, 0.0, 2e-4, "losses with logits + 1000");
}

TEST(VocabShardCrossEntropyKernel, OneShardBackwardMatchesFiniteDifferencesAndMayAliasLogits) {
  const std::int64_t rows = 5, V = 7;
  auto logits = randn(35, "ce.logits", 2.0f);
  const std::vector<std::int32_t> targets = {0, 6, 3, 3, 1};
  const float scale = 1.0f / static_cast<float>(rows);  // mean loss
  std::vector<float> losses(5), lse(5);
  const auto loss = [&] {
    one_shard_cross_entropy(logits.data(), targets.data(), rows, V, losses.data(), lse.data());
    double s = 0.0;
    for (const float l : losses) s += l;
    return s * scale;
  };
  loss();
  std::vector<float> dlogits(35, 9.0f);
  vocab_shard_cross_entropy_backward(logits.data(), lse.data(), targets.data(), 0, scale,
                                     dlogits.data(), rows, V, V);
  // Smooth, curvature ≤ 1/4 per logit: truncation ≈ h²/24 ≈ 4e-6 at h = 1e-2; rounding of
  // 5 losses ≈ ε·|loss|/2h ≈ 1e-5. Tolerance 1e-4 (the gradients themselves are O(0.1)).
  expect_all_near(dlogits, numeric_grad(logits, loss, 1e-2f), 1e-4, 1e-4, "dlogits");

  loss();  // numeric_grad's last forward left lse of a perturbed row behind
  std::vector<float> in_place = logits;
  vocab_shard_cross_entropy_backward(in_place.data(), lse.data(), targets.data(), 0, scale,
                                     in_place.data(), rows, V, V);
  EXPECT_EQ(in_place, dlogits) << "dlogits aliasing logits must give the same bits";
}

/// logits [rows, 13] split as a 4-way vocabulary-parallel lm_head would: V_local = 4 columns
/// per rank, rank s holding ids [4s, 4s + valid_s) with valid = 4, 4, 4, 1; the 3 padding
/// columns of the last rank hold 1e30, which any use would show.
struct VocabShards {
  static constexpr std::int64_t kV = 13, kLocal = 4, kShards = 4;
  std::int64_t rows;
  std::vector<std::vector<float>> logits;  // [shard][rows·kLocal]
  static std::int64_t first(std::int64_t s) { return s * kLocal; }
  static std::int64_t valid(std::int64_t s) { return std::min(kLocal, kV - first(s)); }
  VocabShards(const std::vector<float>& full, std::int64_t n_rows) : rows(n_rows) {
    for (std::int64_t s = 0; s < kShards; ++s) {
      std::vector<float> shard(zu(rows * kLocal), 1e30f);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t j = 0; j < valid(s); ++j) {
          shard[zu(r * kLocal + j)] = full[zu(r * kV + first(s) + j)];
        }
      }
      logits.push_back(std::move(shard));
    }
  }
};

TEST(VocabShardCrossEntropyKernel, FourShardsCombineToTheFullLossAndLse) {
  const std::int64_t rows = 6;
  const std::int64_t V = VocabShards::kV;
  const auto full = randn(zu(rows * V), "vce.logits", 3.0f);
  // Targets in every shard, on shard edges, and the last shard's single id 12.
  const std::vector<std::int32_t> targets = {0, 12, 5, 3, 12, 8};
  const VocabShards sh(full, rows);

  // The layer: max → all-reduce max; sum_exp, target_logit → all-reduce sum (in f32).
  std::vector<float> gmax(zu(rows), -std::numeric_limits<float>::infinity());
  std::vector<float> m(zu(rows));
  for (std::int64_t s = 0; s < VocabShards::kShards; ++s) {
    vocab_shard_max(sh.logits[zu(s)].data(), rows, VocabShards::kLocal, sh.valid(s), m.data());
    for (std::size_t r = 0; r < m.size(); ++r) gmax[r] = std::max(gmax[r], m[r]);
  }
  std::vector<float> gsum(zu(rows), 0.0f), gtarget(zu(rows), 0.0f), se(zu(rows)), tl(zu(rows));
  for (std::int64_t s = 0; s < VocabShards::kShards; ++s) {
    vocab_shard_sum_exp(sh.logits[zu(s)].data(), gmax.data(), targets.data(), sh.first(s), rows,
                        VocabShards::kLocal, sh.valid(s), se.data(), tl.data());
    for (std::size_t r = 0; r < se.size(); ++r) {
      gsum[r] += se[r];
      gtarget[r] += tl[r];
    }
  }
  std::vector<float> lse(zu(rows)), loss(zu(rows));
  for (std::size_t r = 0; r < lse.size(); ++r) {
    lse[r] = gmax[r] + std::log(gsum[r]);
    loss[r] = lse[r] - gtarget[r];
    // Exactly one shard holds the target, so the sum of target logits is that logit.
    EXPECT_EQ(gtarget[r], full[r * zu(V) + zu(targets[r])]) << "row " << r;
  }
  std::vector<float> loss_one(zu(rows)), lse_one(zu(rows));
  one_shard_cross_entropy(full.data(), targets.data(), rows, V, loss_one.data(), lse_one.data());
  // Both are max + log Σ exp(z − max) with the same f32 exps; the four shards round 4 partial
  // sums to f32 and add them in f32 where one shard rounds one sum, one or two ε more.
  expect_all_near(lse, to_double(lse_one), 1e-6, 0.0, "combined lse vs one shard");
  expect_all_near(loss, to_double(loss_one), 1e-6, 0.0, "combined loss vs one shard");
  std::vector<double> loss_ref, lse_ref;
  naive_cross_entropy(full, targets, V, &loss_ref, &lse_ref);
  // As OneShardMatchesNaiveLogSoftmaxAndIsStable: a few ε relative over 13 terms.
  expect_all_near(lse, lse_ref, 1e-5, 1e-6, "combined lse vs naive");
  expect_all_near(loss, loss_ref, 1e-5, 1e-6, "combined loss vs naive");

  // A rank without vocabulary columns contributes the identities of the all-reduces.
  std::vector<float> empty_max(zu(rows)), empty_sum(zu(rows), 5.0f), empty_t(zu(rows), 5.0f);
  vocab_shard_max(sh.logits[3].data(), rows, VocabShards::kLocal, 0, empty_max.data());
  vocab_shard_sum_exp(sh.logits[3].data(), gmax.data(), targets.data(), 13, rows,
                      VocabShards::kLocal, 0, empty_sum.data(), empty_t.data());
  for (std::size_t r = 0; r < zu(rows); ++r) {
    EXPECT_EQ(empty_max[r], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(empty_sum[r], 0.0f);
    EXPECT_EQ(empty_t[r], 0.0f);
  }
}

TEST(VocabShardCrossEntropyKernel, ShardBackwardIsTheSliceOfTheFullBackward) {
  const std::int64_t rows = 6;
  const std::int64_t V = VocabShards::kV, L = VocabShards::kLocal;
  const auto full = randn(zu(rows * V), "vce.logits", 3.0f);
  const std::vector<std::int32_t> targets = {0, 12, 5, 3, 12, 8};
  const VocabShards sh(full, rows);
  const float scale = 1.0f / static_cast<float>(rows);
  std::vector<float> losses(zu(rows)), lse(zu(rows)), dfull(full.size());
  one_shard_cross_entropy(full.data(), targets.data(), rows, V, losses.data(), lse.data());
  vocab_shard_cross_entropy_backward(full.data(), lse.data(), targets.data(), 0, scale,
                                     dfull.data(), rows, V, V);
  for (std::int64_t s = 0; s < VocabShards::kShards; ++s) {
    std::vector<float> d(zu(rows * L), 9.0f);  // overwritten, padding included
    vocab_shard_cross_entropy_backward(sh.logits[zu(s)].data(), lse.data(), targets.data(),
                                       sh.first(s), scale, d.data(), rows, L, sh.valid(s));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < L; ++j) {
        // Given the same lse, each column is the one-shard gradient's to the bit; padding 0.
        const float want = j < sh.valid(s) ? dfull[zu(r * V + sh.first(s) + j)] : 0.0f;
        EXPECT_EQ(d[zu(r * L + j)], want) << "shard " << s << " row " << r << " column " << j;
      }
    }
    std::vector<float> in_place = sh.logits[zu(s)];
    vocab_shard_cross_entropy_backward(in_place.data(), lse.data(), targets.data(), sh.first(s),
                                       scale, in_place.data(), rows, L, sh.valid(s));
    EXPECT_EQ(in_place, d) << "dlogits aliasing logits, shard " << s;
  }
}

// ---------------------------------------------------------------------------------------------
// Embedding shards

TEST(EmbeddingShardKernel, WholeTableForwardGathersAndBackwardAccumulatesRepeatedIds) {
  const std::int64_t table_rows = 6, C = 70, rows = 8;  // C = 70: uneven column ranges
  auto table = randn(zu(table_rows * C), "emb.table");
  const std::vector<std::int32_t> ids = {3, 1, 3, 0, 5, 3, 1, 2};
  const auto dout = randn(zu(rows * C), "emb.dout");
  std::vector<float> out(zu(rows * C));
  embedding_shard_forward(ids.data(), table.data(), 0, table_rows, out.data(), rows, C);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    for (std::size_t c = 0; c < zu(C); ++c) {
      ASSERT_EQ(out[r * 70 + c], table[zu(ids[r]) * 70 + c]) << r << "," << c;
    }
  }

  const auto dtable0 = randn(table.size(), "emb.dtable0");
  std::vector<float> dtable = dtable0;
  embedding_shard_backward(ids.data(), dout.data(), 0, table_rows, dtable.data(), rows, C);
  const auto loss = [&] {
    embedding_shard_forward(ids.data(), table.data(), 0, table_rows, out.data(), rows, C);
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

TEST(EmbeddingShardKernel, IdsOutsideTheShardGiveZeroRowsAndNoGradient) {
  // A 10-row table split 4 / 4 / 2 as a vocabulary-parallel embedding would hold it; every
  // token's row comes from exactly one shard, so the sum of the shards' outputs (the
  // all-reduce) is the whole table's lookup, and each shard's gradient is its slice of the
  // whole gradient, to the bit.
  const std::int64_t table_rows = 10, C = 70, rows = 9;  // C = 70: uneven column ranges
  const auto table = randn(zu(table_rows * C), "embs.table");
  const std::vector<std::int32_t> ids = {3, 9, 4, 0, 8, 3, 7, 4, 3};
  const auto dout = randn(zu(rows * C), "embs.dout");
  const auto dtable0 = randn(table.size(), "embs.dtable0");
  std::vector<float> out_full(zu(rows * C)), dtable_full = dtable0;
  embedding_shard_forward(ids.data(), table.data(), 0, table_rows, out_full.data(), rows, C);
  embedding_shard_backward(ids.data(), dout.data(), 0, table_rows, dtable_full.data(), rows, C);

  struct Shard {
    std::int64_t first, size;
  };
  std::vector<float> out_sum(out_full.size(), 0.0f);
  for (const Shard s : {Shard{0, 4}, Shard{4, 4}, Shard{8, 2}}) {
    const float* shard_table = table.data() + s.first * C;
    std::vector<float> out(out_full.size(), 5.0f);  // overwritten, zero rows included
    embedding_shard_forward(ids.data(), shard_table, s.first, s.size, out.data(), rows, C);
    std::vector<float> dshard(dtable0.begin() + s.first * C,
                              dtable0.begin() + (s.first + s.size) * C);
    embedding_shard_backward(ids.data(), dout.data(), s.first, s.size, dshard.data(), rows, C);
    for (std::int64_t r = 0; r < rows; ++r) {
      const bool inside = ids[zu(r)] >= s.first && ids[zu(r)] < s.first + s.size;
      for (std::int64_t c = 0; c < C; ++c) {
        const float want = inside ? out_full[zu(r * C + c)] : 0.0f;
        ASSERT_EQ(out[zu(r * C + c)], want) << "shard " << s.first << " row " << r << "," << c;
        out_sum[zu(r * C + c)] += out[zu(r * C + c)];
      }
    }
    const std::vector<float> want(dtable_full.begin() + s.first * C,
                                  dtable_full.begin() + (s.first + s.size) * C);
    EXPECT_EQ(dshard, want) << "dtable slice of shard " << s.first;
  }
  EXPECT_EQ(out_sum, out_full) << "sum over shards";

  // A shard no id falls into: all-zero output, gradient untouched.
  const std::vector<std::int32_t> low = {0, 1, 2};
  std::vector<float> out(zu(3 * C), 5.0f), dshard(zu(2 * C), 1.5f);
  embedding_shard_forward(low.data(), table.data(), 8, 2, out.data(), 3, C);
  embedding_shard_backward(low.data(), dout.data(), 8, 2, dshard.data(), 3, C);
  EXPECT_EQ(out, std::vector<float>(zu(3 * C), 0.0f));
  EXPECT_EQ(dshard, std::vector<float>(zu(2 * C), 1.5f));
}

// ---------------------------------------------------------------------------------------------
// Broken invariants: MT_CHECK prints and aborts (core/error.h), so these are death tests.

TEST(KernelChecksDeathTest, NegativeIdsAndTargetsAndBadDimsAbort) {
  // OpenMP threads exist by now: re-execute the binary for each death test instead of fork().
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<std::int32_t> ids = {1, -1};
  std::vector<float> buf(64, 0.0f), out(64);
  EXPECT_DEATH(embedding_shard_forward(ids.data(), buf.data(), 0, 4, out.data(), 2, 4),
               "embedding_shard_forward: id -1 of row 1 is negative");
  EXPECT_DEATH(embedding_shard_backward(ids.data(), buf.data(), 0, 4, out.data(), 2, 4),
               "embedding_shard_backward: id -1 of row 1 is negative");
  EXPECT_DEATH(embedding_shard_forward(ids.data(), buf.data(), -1, 4, out.data(), 1, 4),
               "bad dims");
  std::vector<float> m(2, 0.0f), s(2), t(2);
  EXPECT_DEATH(
      vocab_shard_sum_exp(buf.data(), m.data(), ids.data(), 0, 2, 4, 4, s.data(), t.data()),
      "target -1 of row 1 is negative");
  EXPECT_DEATH(vocab_shard_max(buf.data(), 2, 4, 5, m.data()), "bad dims");
  EXPECT_DEATH(vocab_shard_cross_entropy_backward(buf.data(), m.data(), ids.data(), 0, 1.0f,
                                                  out.data(), 2, 4, 5),
               "bad dims");
  const QkvRows in{buf.data(), buf.data(), buf.data(), 8, 8};
  EXPECT_DEATH(gqa_attention_forward(in, out.data(), m.data(), {1, 2, 4, 3, 2}), "bad dims");
  EXPECT_DEATH(gqa_attention_forward(in, out.data(), m.data(), {1, 2, 4, 0, 2}), "bad dims");
  EXPECT_DEATH(gqa_attention_forward({buf.data(), buf.data(), buf.data(), 7, 8}, out.data(),
                                     m.data(), {1, 2, 4, 2, 2}),
               "strides");
  EXPECT_DEATH(gqa_attention_backward(in, out.data(), m.data(), out.data(),
                                      {out.data(), out.data(), out.data(), 8, 3}, {1, 2, 4, 2, 2}),
               "strides");
  const std::vector<std::int32_t> pos = {0, 1};
  EXPECT_DEATH(rope_apply(buf.data(), 8, pos.data(), 2, 2, 3, 10000.0f, false), "bad dims");
  EXPECT_DEATH(rope_apply(buf.data(), 7, pos.data(), 2, 2, 4, 10000.0f, false), "bad dims");
  EXPECT_DEATH(rmsnorm_forward(buf.data(), buf.data(), out.data(), m.data(), 2, 0, 1e-5f),
               "bad dims");
  EXPECT_DEATH(
      rmsnorm_backward(buf.data(), buf.data(), m.data(), buf.data(), out.data(), out.data(), -1, 4),
      "bad dims");
  EXPECT_DEATH(swiglu_forward(buf.data(), buf.data(), out.data(), -1), "n=-1");
  EXPECT_DEATH(swiglu_backward(buf.data(), buf.data(), buf.data(), out.data(), out.data(), -1),
               "n=-1");
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
    // Multi-head attention on GPT-2's fused [q | k | v] row.
    const GqaDims ad{12, 64, 4, 4, 32};
    gqa_attention_forward(fused_rows(qkv.data(), C), out.data(), lse.data(), ad);
    gqa_attention_backward(fused_rows(qkv.data(), C), out.data(), lse.data(), dy.data(),
                           fused_grad_rows(dqkv.data(), C), ad);
    r.insert(r.end(), {out, lse, dqkv});
    std::vector<float> losses(768), clse(768), dl(logits.size());
    std::vector<std::int32_t> targets(ids);
    // Cross-entropy with one shard holding the whole vocabulary.
    one_shard_cross_entropy(logits.data(), targets.data(), tokens, V, losses.data(), clse.data());
    vocab_shard_cross_entropy_backward(logits.data(), clse.data(), targets.data(), 0, 1.0f / 768,
                                       dl.data(), tokens, V, V);
    r.insert(r.end(), {losses, clse, dl});
    std::vector<float> dtable(static_cast<std::size_t>(65 * C), 0.0f);
    embedding_shard_backward(ids.data(), dy.data(), 0, 65, dtable.data(), tokens, C);
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

    // Grouped-query attention on a Llama-style fused [q | k | v] row: 4 query heads reading
    // 2 kv heads (64 columns each of k and v), backward parallel over (sequence, kv head).
    const GqaDims gd{12, 64, 4, 2, 32};
    const QkvRows gin{qkv.data(), qkv.data() + C, qkv.data() + C + 64, 3 * C, 3 * C};
    std::vector<float> gout(x.size()), glse(lse.size()), gdqkv(qkv.size(), 0.0f);
    gqa_attention_forward(gin, gout.data(), glse.data(), gd);
    gqa_attention_backward(gin, gout.data(), glse.data(), dy.data(),
                           {gdqkv.data(), gdqkv.data() + C, gdqkv.data() + C + 64, 3 * C, 3 * C},
                           gd);
    r.insert(r.end(), {gout, glse, gdqkv});
    std::vector<std::int32_t> positions(static_cast<std::size_t>(tokens));
    for (std::size_t i = 0; i < positions.size(); ++i) {
      positions[i] = static_cast<std::int32_t>(i % 64);
    }
    std::vector<float> roped = x;
    rope_apply(roped.data(), C, positions.data(), tokens, 4, 32, 10000.0f, false);
    r.push_back(roped);
    std::vector<float> ry(x.size()), rrstd(768), rdx(x.size()), rdw(128, 0.0f);
    rmsnorm_forward(x.data(), wt.data(), ry.data(), rrstd.data(), tokens, C, 1e-5f);
    rmsnorm_backward(x.data(), wt.data(), rrstd.data(), dy.data(), rdx.data(), rdw.data(), tokens,
                     C);
    r.insert(r.end(), {ry, rrstd, rdx, rdw});
    std::vector<float> sw(x.size()), dgate(x.size()), dup(x.size());
    swiglu_forward(x.data(), dy.data(), sw.data(), tokens * C);
    swiglu_backward(x.data(), dy.data(), x.data(), dgate.data(), dup.data(), tokens * C);
    r.insert(r.end(), {sw, dgate, dup});
    // A vocabulary shard holding ids [5, 65) in 60 of its 65 columns.
    std::vector<float> vmax(768), vsum(768), vtarget(768), vd(logits.size());
    vocab_shard_max(logits.data(), tokens, V, 60, vmax.data());
    vocab_shard_sum_exp(logits.data(), vmax.data(), targets.data(), 5, tokens, V, 60, vsum.data(),
                        vtarget.data());
    vocab_shard_cross_entropy_backward(logits.data(), clse.data(), targets.data(), 5, 1.0f / 768,
                                       vd.data(), tokens, V, 60);
    r.insert(r.end(), {vmax, vsum, vtarget, vd});
    // An embedding shard holding ids [10, 50).
    std::vector<float> eout(x.size()), edtable(static_cast<std::size_t>(40 * C), 0.0f);
    embedding_shard_forward(ids.data(), x.data(), 10, 40, eout.data(), tokens, C);
    embedding_shard_backward(ids.data(), dy.data(), 10, 40, edtable.data(), tokens, C);
    r.insert(r.end(), {eout, edtable});
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

// The vectorisable exps (kernels/cpu/vector_math.h): exp_approx, which the cross-entropy uses in
// `omp simd` loops, and exp_approx_vec on native vectors (GELU, SwiGLU, the attention softmax).

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

// exp_approx_vec on W-lane vectors against exp_approx, lane by lane: true when every lane of
// every point is the scalar form's bit for bit, or NaN where the scalar form gives NaN.
template <std::int64_t W>
bool vector_exp_is_scalar_exp(const std::vector<float>& points) {
  using V = cpu::FloatVec<W>;
  bool same = true;
  for (std::size_t i0 = 0; i0 < points.size(); i0 += W) {
    V x{};
    for (std::int64_t l = 0; l < W; ++l) x[l] = points[std::min(i0 + l, points.size() - 1)];
    const V e = cpu::exp_approx_vec(x);
    for (std::int64_t l = 0; l < W; ++l) {
      const float scalar = cpu::exp_approx(x[l]);
      const bool lane_same = std::isnan(scalar) ? std::isnan(e[l])
                                                : std::bit_cast<std::uint32_t>(e[l]) ==
                                                      std::bit_cast<std::uint32_t>(scalar);
      if (!lane_same) {
        ADD_FAILURE() << W << " lanes: exp_approx_vec(" << x[l] << ") = " << e[l]
                      << ", exp_approx = " << scalar;
        same = false;
      }
    }
  }
  return same;
}

TEST(ExpApproxKernel, EveryVectorFormIsTheScalarFormBitwiseAtTheClampAndRoundingEdges) {
  // The native width and half of it: on AVX-512 the VSCALEFPS form (16) and the AVX form
  // (8, VMAXPS/VMINPS clamp); on AVX2 the AVX form (8) and the portable one (4). Points: each
  // clamp bound and the floats beside it, far outside, ±inf, ±0, a subnormal, and x just
  // either side of (k + ½)·ln 2, where the rounding of x·log2(e) to n may tie.
  std::vector<float> points = {0.0f,
                               -0.0f,
                               1e-40f,
                               -1e-40f,
                               1000.0f,
                               -1000.0f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
  for (const float bound : {-87.3f, 88.3f}) {
    float x = bound;
    for (int i = 0; i < 4; ++i) x = std::nextafter(x, -1000.0f);
    for (int i = 0; i < 9; ++i, x = std::nextafter(x, 1000.0f)) points.push_back(x);
  }
  for (int k = -126; k <= 127; ++k) {
    const float mid = static_cast<float>((k + 0.5) * 0.6931471805599453);
    points.push_back(std::nextafter(mid, -1000.0f));
    points.push_back(mid);
    points.push_back(std::nextafter(mid, 1000.0f));
  }
  EXPECT_TRUE(vector_exp_is_scalar_exp<cpu::kLanes>(points));
  EXPECT_TRUE(vector_exp_is_scalar_exp<cpu::kLanes / 2>(points));
}

TEST(ExpApproxKernel, VectorFormIsTheScalarFormBitwiseAndKeepsNaN) {
  // The same grid as above, a native vector at a time. On AVX-512 the vector form scales by
  // 2ⁿ with VSCALEFPS but rounds x/ln2 with the same FMA and rounding constant as exp_approx,
  // so every lane must be exp_approx's bit for bit (the attention softmax runs on the vector
  // form and must match the kernels on the scalar one). (Its first version rounded the
  // rounded product with VRNDSCALEPS, which can tie the other way; no point of this grid hit
  // such a tie, so the grid does not tell the two apart.)
  using V = cpu::FloatVec<cpu::kLanes>;
  double worst = 0.0, worst_vs_scalar = 0.0;
  int differ = 0, total = 0;
  for (int i0 = -87 * 64; i0 <= 88 * 64; i0 += static_cast<int>(cpu::kLanes)) {
    V x{};
    for (int l = 0; l < cpu::kLanes; ++l)
      x[l] = static_cast<float>(std::min(i0 + l, 88 * 64)) / 64.0f;
    const V e = cpu::exp_approx_vec(x);
    for (int l = 0; l < cpu::kLanes; ++l) {
      const double ref = std::exp(static_cast<double>(x[l]));
      worst = std::max(worst, std::abs(static_cast<double>(e[l]) - ref) / ref);
      const float scalar = cpu::exp_approx(x[l]);
      worst_vs_scalar = std::max(worst_vs_scalar, std::abs(static_cast<double>(e[l]) - scalar) /
                                                      static_cast<double>(scalar));
      differ += e[l] != scalar;
      ++total;
    }
  }
  std::printf(
      "exp_approx_vec max relative error %.3g; differs from exp_approx in %d of %d (max %.3g)\n",
      worst, differ, total, worst_vs_scalar);
  EXPECT_LE(worst, 2.4e-7);
  EXPECT_EQ(differ, 0) << "max relative difference " << worst_vs_scalar;
  // Clamped ends as the scalar form's; NaN stays NaN (a NaN loss must surface, not become 0).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const V ends = cpu::exp_approx_vec(V{} + -1000.0f), big = cpu::exp_approx_vec(V{} + 1000.0f);
  const V nans = cpu::exp_approx_vec(V{} + nan);
  for (int l = 0; l < cpu::kLanes; ++l) {
    EXPECT_GE(ends[l], 0.0f);
    EXPECT_LT(ends[l], 1e-37f);
    EXPECT_TRUE(std::isfinite(big[l]));
    EXPECT_TRUE(std::isnan(nans[l]));
  }
}

}  // namespace
}  // namespace meshtrain::kernels
