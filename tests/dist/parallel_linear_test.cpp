// ColumnParallelLinear and RowParallelLinear over the world as the tp group, against the plain
// Linear that every rank builds itself from the same (seed, name): the reference needs no
// communication, so a mismatch is in the parallel code. With and without sequence
// parallelism; shards are checked to be bitwise slices of the unsharded initial weight.
#include "meshtrain/layers/parallel_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "dist_env.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/layers/linear.h"

namespace meshtrain {
namespace {

constexpr std::int64_t kTokens = 8, kIn = 8, kOut = 12;  // divisible by tp ∈ {1, 2, 4}
constexpr std::uint64_t kSeed = 1234;

Tensor random(Shape shape, std::string_view name) {
  Tensor t = Tensor::empty(std::move(shape), MemCategory::other);
  fill_normal(t.span_f32(), 99, stream_of(name), 0, 0.0f, 1.0f);
  return t;
}

// Columns [c0, c1) of a [rows, cols] tensor, copied.
Tensor cols(const Tensor& t, std::int64_t c0, std::int64_t c1) {
  Tensor out = Tensor::empty({t.dim(0), c1 - c0}, MemCategory::other);
  for (std::int64_t r = 0; r < t.dim(0); ++r) {
    std::memcpy(out.f32() + r * (c1 - c0), t.f32() + r * t.dim(1) + c0,
                static_cast<std::size_t>(c1 - c0) * sizeof(float));
  }
  return out;
}

// fp32 sums of ≤ 12 products, re-associated across ranks: ~1e-7 relative; 1e-5 of the
// tensor's largest entry leaves room, and a wrong slice or a missing reduction is off by O(1).
void expect_near(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  double scale = 1e-6;
  for (float v : want.span_f32()) scale = std::max(scale, static_cast<double>(std::abs(v)));
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    ASSERT_NEAR(got.f32()[i], want.f32()[i], 1e-5 * scale) << what << " at " << i;
  }
}

void expect_bitwise(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(std::memcmp(got.f32(), want.f32(), static_cast<std::size_t>(got.bytes())), 0) << what;
}

struct Reference {
  Linear linear{"lin", kIn, kOut, true, 0.02f};
  Tensor x = random({kTokens, kIn}, "x");
  Tensor dy = random({kTokens, kOut}, "dy");
  Tensor y, dx;
  Reference() {
    for (Parameter* p : linear.parameters()) {
      initialize(*p, kSeed);
      // A non-zero bias, so that adding it once (not tp times) is tested.
      if (p->init == InitKind::zeros) p->value.fill(0.5f);
    }
    y = linear.forward(x);
    dx = linear.backward(dy);
  }
};

class ParallelLinear : public ::testing::TestWithParam<bool> {};  // sequence parallel off/on

TEST_P(ParallelLinear, ColumnParallelMatchesLinear) {
  const bool sp = GetParam();
  const auto tp = test::runtime().world_group();
  const std::int64_t n = tp->size(), r = tp->rank();
  const std::int64_t o0 = r * kOut / n, o1 = (r + 1) * kOut / n;
  const std::int64_t t0 = r * kTokens / n, t1 = (r + 1) * kTokens / n;
  Reference ref;
  ColumnParallelLinear layer("lin", {kIn, kOut, true, 0.02f, sp}, *tp);
  ParameterList params = layer.parameters();
  initialize(*params[0], kSeed);
  expect_bitwise(params[0]->value, ref.linear.weight().value.rows(o0, o1), "weight shard = slice");
  params[1]->value.fill(0.5f);

  const Tensor y = layer.forward(sp ? ref.x.rows(t0, t1) : ref.x);
  expect_near(y, cols(ref.y, o0, o1), "y");
  const Tensor dx = layer.backward(cols(ref.dy, o0, o1));
  expect_near(dx, sp ? ref.dx.rows(t0, t1) : ref.dx, "dx");
  expect_near(params[0]->grad, ref.linear.weight().grad.rows(o0, o1), "dW");
  expect_near(params[1]->grad, ref.linear.parameters()[1]->grad.rows(o0, o1), "db");
}

TEST_P(ParallelLinear, RowParallelMatchesLinear) {
  const bool sp = GetParam();
  const auto tp = test::runtime().world_group();
  const std::int64_t n = tp->size(), r = tp->rank();
  const std::int64_t i0 = r * kIn / n, i1 = (r + 1) * kIn / n;
  const std::int64_t t0 = r * kTokens / n, t1 = (r + 1) * kTokens / n;
  Reference ref;
  RowParallelLinear layer("lin", {kIn, kOut, true, 0.02f, sp}, *tp);
  ParameterList params = layer.parameters();
  initialize(*params[0], kSeed);
  expect_bitwise(params[0]->value, cols(ref.linear.weight().value, i0, i1), "weight shard = slice");
  params[1]->value.fill(0.5f);

  const Tensor y = layer.forward(cols(ref.x, i0, i1));
  expect_near(y, sp ? ref.y.rows(t0, t1) : ref.y, "y");
  const Tensor dx = layer.backward(sp ? ref.dy.rows(t0, t1) : ref.dy);
  expect_near(dx, cols(ref.dx, i0, i1), "dx");
  expect_near(params[0]->grad, cols(ref.linear.weight().grad, i0, i1), "dW");
  expect_near(params[1]->grad, ref.linear.parameters()[1]->grad, "db (replicated, full)");
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, ParallelLinear, ::testing::Bool());

}  // namespace
}  // namespace meshtrain
