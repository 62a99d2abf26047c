// tests/unit/kernels/eltwise_order_test.cpp
//
// The summation order that the element-wise kernels document, checked bit for bit (memcmp)
// against references written out in this file, with 1, 2 and 3 threads:
//  - column reductions (bias gradient, the GELU backward's fused bias gradient, LayerNorm's
//    weight and bias gradients): each entry sums its rows in order 0, 1, …, however the
//    columns are split over threads (one contiguous range per thread, cpu_util.h), including
//    widths that are not a multiple of the 16-column split;
//  - LayerNorm rows, normalised 8 at a time: mean = (Σ x in column order)·(1/C), rstd from the
//    squared deviations rounded each and added in column order, y = fma((x − μ)·rstd, w, b),
//    and dx of a row the same whether the row comes alone or among others;
//  - sum_squares: 32 double lanes per block of 8192, each lane one multiply-add per element.
// In the references a product is rounded on its own whenever it is stored before it is added
// (a stored product has a use that is not an add, so the compiler cannot contract it), and
// every fused multiply-add is spelled std::fma.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/kernels.h"
#include "support/bitwise.h"

namespace meshtrain {
namespace {

constexpr std::uint64_t kSeed = 9753;

std::vector<float> randn(std::size_t n, std::string_view name, float stddev = 1.0f,
                         float mean = 0.0f) {
  return test::randn(kSeed, n, name, stddev, mean);
}

using test::same_bits;

class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(kernels::num_threads()) {}
  ~ThreadCountGuard() { kernels::set_num_threads(saved_); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int saved_;
};

// out[j] += Σ_r m[r·C + j], the rows added in order 0, 1, … into a sum that starts at 0.
void add_column_sums(const std::vector<float>& m, std::int64_t rows, std::int64_t C,
                     std::vector<float>& out) {
  for (std::int64_t j = 0; j < C; ++j) {
    float acc = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) acc += m[static_cast<std::size_t>(r * C + j)];
    out[static_cast<std::size_t>(j)] += acc;
  }
}

struct Shape {
  std::int64_t rows, C;
};

// 6L/384's MLP (1024 × 1536); 17 columns over 2000 rows: one full 16-column line and one
// column, split over 2 or 3 threads; 100 and 37 are no multiple of 16; 3 rows stay on one
// thread (below the parallel grain).
const Shape kColumnShapes[] = {{1024, 1536}, {2000, 17}, {600, 100}, {1000, 37}, {3, 100}};

TEST(ColumnReductionOrder, BiasAndGeluBiasGradientsSumRowsInOrderWithAnyThreadCount) {
  const ThreadCountGuard guard;
  for (const Shape& s : kColumnShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " C " + std::to_string(s.C));
    const auto n = static_cast<std::size_t>(s.rows * s.C);
    const auto pre = randn(n, "order.pre", 2.0f), dy = randn(n, "order.dy");
    const auto db0 = randn(static_cast<std::size_t>(s.C), "order.db0");
    std::vector<float> dx_ref(n);
    kernels::gelu_backward(pre.data(), dy.data(), dx_ref.data(), static_cast<std::int64_t>(n));
    std::vector<float> gelu_db_ref = db0, bias_db_ref = db0;
    add_column_sums(dx_ref, s.rows, s.C, gelu_db_ref);
    add_column_sums(dy, s.rows, s.C, bias_db_ref);
    for (const int threads : {1, 2, 3}) {
      kernels::set_num_threads(threads);
      SCOPED_TRACE("threads " + std::to_string(threads));
      std::vector<float> dx(n), db = db0;
      kernels::gelu_bias_backward(pre.data(), dy.data(), dx.data(), db.data(), s.rows, s.C);
      EXPECT_TRUE(same_bits(dx, dx_ref));
      EXPECT_TRUE(same_bits(db, gelu_db_ref));
      std::vector<float> bias_db = db0;
      kernels::bias_backward(dy.data(), bias_db.data(), s.rows, s.C);
      EXPECT_TRUE(same_bits(bias_db, bias_db_ref));
    }
  }
}

struct LnRef {
  std::vector<float> y, mean, rstd;
};

// LayerNorm forward as layernorm.cpp documents it, row by row.
LnRef layernorm_reference(const std::vector<float>& x, const std::vector<float>& w,
                          const std::vector<float>& b, std::int64_t rows, std::int64_t C,
                          float eps) {
  LnRef r{std::vector<float>(x.size()), std::vector<float>(static_cast<std::size_t>(rows)),
          std::vector<float>(static_cast<std::size_t>(rows))};
  const float inv_c = 1.0f / static_cast<float>(C);
  std::vector<float> d2(static_cast<std::size_t>(C));
  for (std::int64_t row = 0; row < rows; ++row) {
    const float* xr = x.data() + row * C;
    float sum = 0.0f;
    for (std::int64_t c = 0; c < C; ++c) sum += xr[c];
    const float mu = sum * inv_c;
    for (std::int64_t c = 0; c < C; ++c)
      d2[static_cast<std::size_t>(c)] = (xr[c] - mu) * (xr[c] - mu);
    float sq = 0.0f;
    for (const float v : d2) sq += v;
    const float rs = 1.0f / std::sqrt(std::fma(sq, inv_c, eps));
    r.mean[static_cast<std::size_t>(row)] = mu;
    r.rstd[static_cast<std::size_t>(row)] = rs;
    for (std::int64_t c = 0; c < C; ++c) {
      r.y[static_cast<std::size_t>(row * C + c)] = std::fma(
          (xr[c] - mu) * rs, w[static_cast<std::size_t>(c)], b[static_cast<std::size_t>(c)]);
    }
  }
  return r;
}

// 13 rows: one group of 8 and a partial group of 5; 1024 × 384 is 6L/384's step; C 37 is odd.
const Shape kNormShapes[] = {{13, 384}, {13, 37}, {1024, 384}, {200, 100}};

TEST(LayerNormOrder, ForwardIsTheDocumentedRowFormulaWithAnyThreadCount) {
  const ThreadCountGuard guard;
  for (const Shape& s : kNormShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " C " + std::to_string(s.C));
    const auto n = static_cast<std::size_t>(s.rows * s.C);
    const auto cs = static_cast<std::size_t>(s.C);
    const auto rows = static_cast<std::size_t>(s.rows);
    // A large mean, as late residual streams have: a one-pass variance would fail here.
    const auto x = randn(n, "order.ln.x", 1.5f, 3.0f);
    const auto w = randn(cs, "order.ln.w", 0.2f, 1.0f), b = randn(cs, "order.ln.b", 0.1f);
    const LnRef ref = layernorm_reference(x, w, b, s.rows, s.C, 1e-5f);
    for (const int threads : {1, 2, 3}) {
      kernels::set_num_threads(threads);
      SCOPED_TRACE("threads " + std::to_string(threads));
      std::vector<float> y(n), mean(rows), rstd(rows);
      kernels::layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(),
                                 s.rows, s.C, 1e-5f);
      EXPECT_TRUE(same_bits(mean, ref.mean));
      EXPECT_TRUE(same_bits(rstd, ref.rstd));
      EXPECT_TRUE(same_bits(y, ref.y));
    }
  }
}

TEST(LayerNormOrder, BackwardRowsDoNotDependOnTheirGroupAndGradientsSumRowsInOrder) {
  const ThreadCountGuard guard;
  for (const Shape& s : kNormShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " C " + std::to_string(s.C));
    const auto n = static_cast<std::size_t>(s.rows * s.C);
    const auto cs = static_cast<std::size_t>(s.C);
    const auto rows = static_cast<std::size_t>(s.rows);
    const auto x = randn(n, "order.lnb.x", 1.5f, 3.0f), dy = randn(n, "order.lnb.dy");
    const auto dres = randn(n, "order.lnb.dres");
    const auto w = randn(cs, "order.lnb.w", 0.2f, 1.0f);
    const auto dw0 = randn(cs, "order.lnb.dw0"), db0 = randn(cs, "order.lnb.db0");
    std::vector<float> y(n), mean(rows), rstd(rows);
    kernels::layernorm_forward(x.data(), w.data(), nullptr, y.data(), mean.data(), rstd.data(),
                               s.rows, s.C, 1e-5f);
    // dx of each row from a call on that row alone (a group of one).
    kernels::set_num_threads(1);
    std::vector<float> dx_ref(n), scratch_dw(cs), scratch_db(cs);
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const std::int64_t off = r * s.C;
      kernels::layernorm_backward(x.data() + off, w.data(), mean.data() + r, rstd.data() + r,
                                  dy.data() + off, dres.data() + off, dx_ref.data() + off,
                                  scratch_dw.data(), scratch_db.data(), 1, s.C);
    }
    // dweight: acc = fma(dy·(x − μ), rstd, acc) over the rows in order; dbias: Σ dy in order.
    std::vector<float> dw_ref = dw0, db_ref = db0;
    for (std::int64_t j = 0; j < s.C; ++j) {
      float acc = 0.0f;
      for (std::int64_t r = 0; r < s.rows; ++r) {
        const auto i = static_cast<std::size_t>(r * s.C + j);
        acc = std::fma(dy[i] * (x[i] - mean[static_cast<std::size_t>(r)]),
                       rstd[static_cast<std::size_t>(r)], acc);
      }
      dw_ref[static_cast<std::size_t>(j)] += acc;
    }
    add_column_sums(dy, s.rows, s.C, db_ref);
    for (const int threads : {1, 2, 3}) {
      kernels::set_num_threads(threads);
      SCOPED_TRACE("threads " + std::to_string(threads));
      std::vector<float> dx(n), dw = dw0, db = db0;
      kernels::layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                  dres.data(), dx.data(), dw.data(), db.data(), s.rows, s.C);
      EXPECT_TRUE(same_bits(dx, dx_ref));
      EXPECT_TRUE(same_bits(dw, dw_ref));
      EXPECT_TRUE(same_bits(db, db_ref));
    }
  }
}

TEST(SumSquaresOrder, ThirtyTwoDoubleLanesPerBlockOfMultiplyAddsWithAnyThreadCount) {
  const ThreadCountGuard guard;
  constexpr std::int64_t kBlock = 8192;  // elementwise.cpp's partition, fixed by n alone
  // n: a tail alone, whole blocks, and blocks with a tail of 45 = one group of 32 and 13.
  for (const std::int64_t n : {std::int64_t{5}, std::int64_t{8192}, std::int64_t{5 * 8192 + 45}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    // Magnitudes spread over decades, so that the lanes' sums round at almost every add and
    // any change of order shows.
    auto x = randn(static_cast<std::size_t>(n), "order.sumsq", 3.0f);
    const auto scale = randn(static_cast<std::size_t>(n), "order.sumsq.scale", 2.0f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] *= std::exp(scale[i]);
    double ref = 0.0;
    for (std::int64_t i0 = 0; i0 < n; i0 += kBlock) {
      const std::int64_t len = std::min(kBlock, n - i0);
      double lane[32] = {};
      std::int64_t i = 0;
      for (; i + 32 <= len; i += 32) {
        for (int l = 0; l < 32; ++l) {
          const double v = static_cast<double>(x[static_cast<std::size_t>(i0 + i + l)]);
          lane[l] = std::fma(v, v, lane[l]);
        }
      }
      for (; i < len; ++i) {
        const double v = static_cast<double>(x[static_cast<std::size_t>(i0 + i)]);
        lane[0] = std::fma(v, v, lane[0]);
      }
      double block = 0.0;
      for (const double v : lane) block += v;
      ref += block;
    }
    for (const int threads : {1, 2, 3}) {
      kernels::set_num_threads(threads);
      const double got = kernels::sum_squares(x.data(), n);
      EXPECT_EQ(std::memcmp(&got, &ref, sizeof got), 0)
          << "threads " << threads << ": " << got << " vs " << ref;
    }
  }
}

}  // namespace
}  // namespace meshtrain
