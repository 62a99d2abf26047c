// The tensor/sequence-parallel region pairs (parallel/tp/tp_regions.h) over the world as one tp
// group, with rank-valued inputs whose results are computable by hand, and the adjoint law
// ⟨F(x), y⟩ = ⟨x, Fᵀ(y)⟩ with inner products taken over the global (gathered) tensors.
#include "meshtrain/parallel/tp/tp_regions.h"

#include <gtest/gtest.h>

#include <cmath>

#include "dist_env.h"
#include "meshtrain/core/rng.h"

namespace meshtrain {
namespace {

Tensor filled(Shape shape, float value) {
  Tensor t = Tensor::empty(std::move(shape), MemCategory::other);
  t.fill(value);
  return t;
}

Tensor random(Shape shape, std::uint64_t seed, std::string_view name) {
  Tensor t = Tensor::empty(std::move(shape), MemCategory::other);
  fill_normal(t.span_f32(), seed, stream_of(name), 0, 0.0f, 1.0f);
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += double{a.f32()[i]} * double{b.f32()[i]};
  return s;
}

TEST(TpRegions, RankValuedForwardAndBackward) {
  const auto tp = test::runtime().world_group();
  const int n = tp->size();
  const float r = static_cast<float>(tp->rank());
  const float rank_sum = static_cast<float>(n * (n - 1) / 2);

  // f: identity forward, all-reduce backward.
  EXPECT_EQ(CopyToTpRegion::forward(filled({2, 3}, r), *tp).f32()[5], r);
  EXPECT_EQ(CopyToTpRegion::backward(filled({2, 3}, r), *tp).f32()[5], rank_sum);
  // g: all-reduce forward, identity backward.
  EXPECT_EQ(ReduceFromTpRegion::forward(filled({2, 3}, r), *tp).f32()[0], rank_sum);
  EXPECT_EQ(ReduceFromTpRegion::backward(filled({2, 3}, r), *tp).f32()[0], r);

  // Sequence parallel: 2 rows per rank, 3 features.
  const Tensor gathered = GatherFromSequenceRegion::forward(filled({2, 3}, r), *tp);
  ASSERT_EQ(gathered.shape(), (Shape{2 * n, 3}));
  for (int q = 0; q < n; ++q) EXPECT_EQ(gathered.f32()[(2 * q + 1) * 3], static_cast<float>(q));
  const Tensor scattered = ScatterToSequenceRegion::forward(filled({2 * n, 3}, r + 1), *tp);
  ASSERT_EQ(scattered.shape(), (Shape{2, 3}));
  EXPECT_EQ(scattered.f32()[0], rank_sum + static_cast<float>(n));
  EXPECT_EQ(GatherFromSequenceRegion::backward(filled({2 * n, 3}, 1.0f), *tp).f32()[4],
            static_cast<float>(n));
  EXPECT_EQ(ScatterToSequenceRegion::backward(filled({2, 3}, r), *tp).shape(), (Shape{2 * n, 3}));
}

// The sequence-parallel pair: gather's forward takes the sharded x to the replicated X, so
// ⟨gather(x), Y⟩ (Y replicated: computed once) must equal Σ_ranks ⟨x_r, reduce_scatter(Y)_r⟩
// — with Y written as the sum of per-rank partials Y = Σ_r Y_r. Checks that backward is the
// transpose of forward, not merely some other collective.
TEST(TpRegions, SequencePairIsAdjoint) {
  const auto tp = test::runtime().world_group();
  const Tensor x = random({4, 5}, 7 + static_cast<std::uint64_t>(tp->rank()), "x");
  const Tensor y_partial =
      random({4 * tp->size(), 5}, 11 + static_cast<std::uint64_t>(tp->rank()), "y");
  const Tensor gx = GatherFromSequenceRegion::forward(x, *tp);
  const Tensor y_full = ReduceFromTpRegion::forward(y_partial.clone(), *tp);  // Σ_r Y_r
  const double lhs = dot(gx, y_full);  // the same on every rank
  double rhs = dot(x, GatherFromSequenceRegion::backward(y_partial, *tp));
  tp->all_reduce_sum(std::span<double>(&rhs, 1));
  EXPECT_NEAR(lhs, rhs, 1e-4 * std::abs(lhs) + 1e-4);  // fp32 sums of ≤ 160 products
}

}  // namespace
}  // namespace meshtrain
