// ColumnParallelLinear and RowParallelLinear over the world as the tp group, against the plain
// layer (the same class over a one-rank group) that every rank builds itself from the same
// (seed, name): the reference needs no communication, so a mismatch is in the parallel code.
// With and without sequence parallelism; shards are checked to be bitwise slices of the
// unsharded initial weight, also for a weight split in parts (GPT-2's fused c_attn).
#include "meshtrain/parallel/tp/parallel_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "support/placements.h"
#include "dist_env.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/core/rng.h"

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

// The plain linear y = x·Wᵀ + b over a one-rank group, with a non-zero bias so that adding it
// once (not tp times) is tested.
struct Reference {
  std::unique_ptr<ProcessGroup> one = single_rank_group("tp");
  ColumnParallelLinear linear{{{"lin", 0.02f}},
                              test::records_table({test::column_records("lin", kOut, kIn, true)}),
                              TensorParallel{*one}};
  Tensor x = random({kTokens, kIn}, "x");
  Tensor dy = random({kTokens, kOut}, "dy");
  Tensor y, dx;
  Parameter& weight() { return *linear.parameters()[0]; }
  Parameter& bias() { return *linear.parameters()[1]; }
  Reference() {
    for (Parameter* p : linear.parameters()) {
      initialize(*p, kSeed);
      if (p->init == InitKind::zeros) p->value.fill(0.5f);
    }
    y = linear.forward(x, {})[0];
    dx = linear.backward(std::span<const Tensor>(&dy, 1), {});
  }
};

class ParallelLinear : public ::testing::TestWithParam<bool> {};  // sequence parallel off/on

TEST_P(ParallelLinear, ColumnParallelMatchesPlainLayer) {
  const bool sp = GetParam();
  const auto tp = test::runtime().world_group();
  const std::int64_t n = tp->size(), r = tp->rank();
  const std::int64_t o0 = r * kOut / n, o1 = (r + 1) * kOut / n;
  const std::int64_t t0 = r * kTokens / n, t1 = (r + 1) * kTokens / n;
  Reference ref;
  ColumnParallelLinear layer({{"lin", 0.02f}},
                             test::records_table({test::column_records("lin", kOut, kIn, true)}),
                             TensorParallel{*tp, sp});
  ParameterList params = layer.parameters();
  initialize(*params[0], kSeed);
  expect_bitwise(params[0]->value, ref.weight().value.rows(o0, o1), "weight shard = slice");
  params[1]->value.fill(0.5f);

  const Tensor y = layer.forward(sp ? ref.x.rows(t0, t1) : ref.x, {})[0];
  expect_near(y, cols(ref.y, o0, o1), "y");
  const Tensor dy = cols(ref.dy, o0, o1);
  const Tensor dx = layer.backward(std::span<const Tensor>(&dy, 1), {});
  expect_near(dx, sp ? ref.dx.rows(t0, t1) : ref.dx, "dx");
  expect_near(params[0]->grad, ref.weight().grad.rows(o0, o1), "dW");
  expect_near(params[1]->grad, ref.bias().grad.rows(o0, o1), "db");
}

TEST_P(ParallelLinear, RowParallelMatchesPlainLayer) {
  const bool sp = GetParam();
  const auto tp = test::runtime().world_group();
  const std::int64_t n = tp->size(), r = tp->rank();
  const std::int64_t i0 = r * kIn / n, i1 = (r + 1) * kIn / n;
  const std::int64_t t0 = r * kTokens / n, t1 = (r + 1) * kTokens / n;
  Reference ref;
  RowParallelLinear layer("lin", test::records_table({test::row_records("lin", kOut, kIn, true)}),
                          0.02f, TensorParallel{*tp, sp});
  ParameterList params = layer.parameters();
  initialize(*params[0], kSeed);
  expect_bitwise(params[0]->value, cols(ref.weight().value, i0, i1), "weight shard = slice");
  params[1]->value.fill(0.5f);

  const Tensor y = layer.forward(cols(ref.x, i0, i1), {});
  expect_near(y, sp ? ref.y.rows(t0, t1) : ref.y, "y");
  const Tensor dx = layer.backward(sp ? ref.dy.rows(t0, t1) : ref.dy, {});
  expect_near(dx, cols(ref.dx, i0, i1), "dx");
  expect_near(params[0]->grad, cols(ref.weight().grad, i0, i1), "dW");
  // The replicated bias: full without SP; under SP this rank's tokens only (summed over tp
  // once per step by ReplicatedGradSum), so the sum over ranks is the full gradient.
  Tensor db = params[1]->grad.clone(MemCategory::other);
  if (sp) tp->all_reduce_sum(db.span_f32());
  expect_near(db, ref.bias().grad, "db (replicated)");
}

// A weight in 3 parts ([q; k; v] of 4 rows each) next to a plain one, sharing one input: each
// part is split separately, so the shard holds rows {r·4/tp…} of every part.
TEST_P(ParallelLinear, ColumnParallelWithPartsAndTwoWeightsMatchesPlainLayers) {
  const bool sp = GetParam();
  const auto tp = test::runtime().world_group();
  const std::int64_t n = tp->size(), r = tp->rank();
  const std::int64_t t0 = r * kTokens / n, t1 = (r + 1) * kTokens / n;
  const auto one = single_rank_group("tp");
  const std::vector<ColumnWeight> weights{{"fused", 0.02f}, {"other", 0.03f}};
  const PlacementTable records = test::records_table(
      {test::column_records("fused", kOut, kIn, false, 3), test::column_records("other", kOut, kIn, false)});
  ColumnParallelLinear plain(weights, records, TensorParallel{*one});
  ColumnParallelLinear layer(weights, records, TensorParallel{*tp, sp});
  for (Parameter* p : plain.parameters()) initialize(*p, kSeed);
  for (Parameter* p : layer.parameters()) initialize(*p, kSeed);
  const Tensor x = random({kTokens, kIn}, "x");
  const std::vector<Tensor> ys_full = plain.forward(x, {});
  const std::vector<Tensor> dys_full{random({kTokens, kOut}, "dy0"),
                                     random({kTokens, kOut}, "dy1")};
  const Tensor dx_full = plain.backward(dys_full, {});

  // The rows of this rank: per part of `block` rows, [r·block/n, (r+1)·block/n).
  auto shard_rows = [&](const Tensor& t, std::int64_t parts, bool transpose_cols) {
    const std::int64_t block = kOut / parts, piece = block / n;
    std::vector<Tensor> pieces;
    for (std::int64_t p = 0; p < parts; ++p) {
      const std::int64_t a = p * block + r * piece, b = a + piece;
      pieces.push_back(transpose_cols ? cols(t, a, b) : t.rows(a, b).clone(MemCategory::other));
    }
    const std::int64_t width = transpose_cols ? parts * piece : t.dim(1);
    const std::int64_t height = transpose_cols ? t.dim(0) : parts * piece;
    Tensor out = Tensor::empty({height, width}, MemCategory::other);
    for (std::int64_t p = 0; p < parts; ++p) {
      for (std::int64_t i = 0; i < pieces[p].dim(0); ++i) {
        for (std::int64_t j = 0; j < pieces[p].dim(1); ++j) {
          const std::int64_t row = transpose_cols ? i : p * piece + i;
          const std::int64_t col = transpose_cols ? p * piece + j : j;
          out.f32()[row * width + col] = pieces[p].f32()[i * pieces[p].dim(1) + j];
        }
      }
    }
    return out;
  };
  const ParameterList mine = layer.parameters(), ref = plain.parameters();
  expect_bitwise(mine[0]->value, shard_rows(ref[0]->value, 3, false),
                 "fused shard = per-part slice");
  expect_bitwise(mine[1]->value, shard_rows(ref[1]->value, 1, false), "other shard = slice");

  const std::vector<Tensor> ys = layer.forward(sp ? x.rows(t0, t1) : x, {});
  expect_near(ys[0], shard_rows(ys_full[0], 3, true), "y fused");
  expect_near(ys[1], shard_rows(ys_full[1], 1, true), "y other");
  const std::vector<Tensor> dys{shard_rows(dys_full[0], 3, true), shard_rows(dys_full[1], 1, true)};
  const Tensor dx = layer.backward(dys, {});
  expect_near(dx, sp ? dx_full.rows(t0, t1) : dx_full, "dx (sum of both weights' dX)");
  expect_near(mine[0]->grad, shard_rows(ref[0]->grad, 3, false), "dW fused");
  expect_near(mine[1]->grad, shard_rows(ref[1]->grad, 1, false), "dW other");
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, ParallelLinear, ::testing::Bool());

}  // namespace
}  // namespace meshtrain
