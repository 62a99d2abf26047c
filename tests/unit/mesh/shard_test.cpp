// Tests of the tensor-parallel shard geometry in layers/parameter.h: Megatron's even split
// (even_shard), the contiguous runs of a shard (runs_of), and that a shard is initialised bit
// for bit as the matching slice of the whole parameter, padding zero (DESIGN invariant 1).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "meshtrain/layers/parameter.h"

namespace meshtrain {
namespace {

struct SplitCase {
  std::int64_t n;  // entries of the split dimension (all parts together)
  int ranks;
  std::int64_t parts;
};

// Which local elements of `slice`'s tensor are real (covered by a run); the rest is padding.
std::vector<bool> real_mask(const ShardSlice& slice, std::int64_t local_numel) {
  std::vector<bool> real(static_cast<std::size_t>(local_numel), false);
  for (const ShardRun& run : runs_of(slice)) {
    for (std::int64_t i = 0; i < run.count; ++i)
      real[static_cast<std::size_t>(run.local + i)] = true;
  }
  return real;
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

const SplitCase kCases[] = {
    {8, 1, 1},  {8, 2, 1},  {8, 4, 1},   {8, 8, 1}, {65, 2, 1},  {65, 4, 1},
    {65, 8, 1}, {64, 3, 1}, {3, 4, 1},   {5, 8, 1}, {384, 2, 3}, {384, 4, 3},
    {15, 2, 3}, {12, 4, 3}, {352, 8, 1}, {1, 1, 1}, {7, 7, 1},   {9, 2, 3},
};

TEST(EvenShard, PiecesOfAllRanksAreDisjointCoverEveryIndexAndShareOneStride) {
  for (const SplitCase& k : kCases) {
    SCOPED_TRACE(::testing::Message()
                 << "n " << k.n << ", ranks " << k.ranks << ", parts " << k.parts);
    const std::int64_t block = k.n / k.parts;
    const std::int64_t piece = (block + k.ranks - 1) / k.ranks;
    std::vector<int> owners(static_cast<std::size_t>(block), 0);
    bool padded_before = false;
    for (int r = 0; r < k.ranks; ++r) {
      const ShardSlice s = even_shard({k.n, 5}, 0, r, k.ranks, k.parts);
      EXPECT_EQ(s.dim, 0);
      EXPECT_EQ(s.parts, k.parts);
      EXPECT_EQ(s.stride, piece) << "every rank has the same local size";
      EXPECT_EQ(s.logical_shape, (Shape{k.n, 5}));
      ASSERT_GE(s.length, 0);
      ASSERT_LE(s.length, s.stride);
      for (std::int64_t i = s.offset; i < s.offset + s.length; ++i) {
        ASSERT_LT(i, block);
        ++owners[static_cast<std::size_t>(i)];
      }
      const bool padded = s.length < s.stride;
      EXPECT_TRUE(!padded_before || padded) << "rank " << r << " is full after a padded rank";
      padded_before = padded_before || padded;
      if (block % k.ranks == 0) {
        EXPECT_FALSE(padded) << "rank " << r;
      }
    }
    for (std::int64_t i = 0; i < block; ++i) {
      EXPECT_EQ(owners[static_cast<std::size_t>(i)], 1) << "index " << i << " of each part";
    }
  }
}

TEST(EvenShard, RunsOfAllRanksCoverTheLogicalTensorOnceInEitherDimension) {
  for (const SplitCase& k : kCases) {
    for (int dim : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "n " << k.n << ", ranks " << k.ranks << ", parts "
                                        << k.parts << ", dim " << dim);
      const Shape logical = dim == 0 ? Shape{k.n, 3} : Shape{3, k.n};
      std::vector<int> hits(static_cast<std::size_t>(numel_of(logical)), 0);
      for (int r = 0; r < k.ranks; ++r) {
        const ShardSlice s = even_shard(logical, dim, r, k.ranks, k.parts);
        Shape local = logical;
        local[static_cast<std::size_t>(dim)] = k.parts * s.stride;
        const std::int64_t local_numel = numel_of(local);
        std::int64_t previous_end = 0;
        std::int64_t real = 0;
        for (const ShardRun& run : runs_of(s)) {
          EXPECT_GE(run.local, previous_end) << "runs are in increasing local order";
          previous_end = run.local + run.count;
          ASSERT_LE(previous_end, local_numel);
          ASSERT_LE(run.logical + run.count, numel_of(logical));
          for (std::int64_t i = 0; i < run.count; ++i) {
            ++hits[static_cast<std::size_t>(run.logical + i)];
          }
          real += run.count;
        }
        EXPECT_EQ(real, s.length * k.parts * (numel_of(logical) / k.n));
      }
      for (std::size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i], 1) << "element " << i;
    }
  }
}

TEST(RunsOf, RowSplitIsOneRunOfWholeRows) {
  const ShardSlice s = even_shard({8, 3}, 0, 1, 2);
  EXPECT_EQ(s.offset, 4);
  EXPECT_EQ(s.length, 4);
  EXPECT_EQ(s.stride, 4);
  const auto runs = runs_of(s);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].local, 0);
  EXPECT_EQ(runs[0].logical, 12);
  EXPECT_EQ(runs[0].count, 12);
}

TEST(RunsOf, ColumnSplitOfARowParallelWeightIsOneRunPerRow) {
  // A [4, 6] weight split in columns over 2 ranks: rank 1 holds columns 3..5 of every row.
  const ShardSlice s = even_shard({4, 6}, 1, 1, 2);
  EXPECT_EQ(s.dim, 1);
  EXPECT_EQ(s.offset, 3);
  EXPECT_EQ(s.length, 3);
  const auto runs = runs_of(s);
  ASSERT_EQ(runs.size(), 4u);
  for (std::int64_t row = 0; row < 4; ++row) {
    const ShardRun& run = runs[static_cast<std::size_t>(row)];
    EXPECT_EQ(run.local, row * 3);
    EXPECT_EQ(run.logical, row * 6 + 3);
    EXPECT_EQ(run.count, 3);
  }
  // Padded columns: [2, 5] over 2 ranks, rank 1 holds columns 3, 4 of a stride of 3.
  const ShardSlice p = even_shard({2, 5}, 1, 1, 2);
  EXPECT_EQ(p.length, 2);
  EXPECT_EQ(p.stride, 3);
  const auto padded = runs_of(p);
  ASSERT_EQ(padded.size(), 2u);
  EXPECT_EQ(padded[0].local, 0);
  EXPECT_EQ(padded[0].logical, 3);
  EXPECT_EQ(padded[0].count, 2);
  EXPECT_EQ(padded[1].local, 3);
  EXPECT_EQ(padded[1].logical, 8);
  EXPECT_EQ(padded[1].count, 2);
}

TEST(RunsOf, FusedQkvShardHoldsTheSameHeadsOfQKAndV) {
  // [q; k; v] of 4 rows each (×2 columns) over 2 ranks: rank 1 holds rows 2, 3 of each part.
  const ShardSlice s = even_shard({12, 2}, 0, 1, 2, 3);
  EXPECT_EQ(s.parts, 3);
  EXPECT_EQ(s.offset, 2);
  EXPECT_EQ(s.length, 2);
  EXPECT_EQ(s.stride, 2);
  const auto runs = runs_of(s);
  ASSERT_EQ(runs.size(), 3u);
  for (std::int64_t part = 0; part < 3; ++part) {
    const ShardRun& run = runs[static_cast<std::size_t>(part)];
    EXPECT_EQ(run.local, part * 4);              // 2 rows × 2 columns per part locally
    EXPECT_EQ(run.logical, (part * 4 + 2) * 2);  // rows 2, 3 of part `part`
    EXPECT_EQ(run.count, 4);
  }
}

TEST(RunsOf, PaddedVocabularyShardLeavesThePaddingRowsOut) {
  // V = 65 over 4 ranks: 17 rows each; the last holds rows 51..64 (14 real) + 3 padding rows.
  for (int r = 0; r < 4; ++r) {
    const ShardSlice s = even_shard({65, 128}, 0, r, 4);
    EXPECT_EQ(s.stride, 17);
    EXPECT_EQ(s.offset, 17 * r);
    EXPECT_EQ(s.length, r < 3 ? 17 : 14);
    const auto runs = runs_of(s);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].local, 0);
    EXPECT_EQ(runs[0].logical, 17 * r * 128);
    EXPECT_EQ(runs[0].count, (r < 3 ? 17 : 14) * 128);
  }
  // More ranks than rows: the extra ranks hold only padding and no run.
  const ShardSlice empty = even_shard({3, 4}, 0, 3, 4);
  EXPECT_EQ(empty.length, 0);
  EXPECT_EQ(empty.stride, 1);
  EXPECT_TRUE(runs_of(empty).empty());
}

struct InitCase {
  Shape logical;
  int dim;
  int ranks;
  std::int64_t parts;
};

TEST(ParameterShard, InitializeGivesTheBitwiseSliceOfTheWholeParameterAndZeroPadding) {
  constexpr std::uint64_t kSeed = 1337;
  const InitCase cases[] = {
      {{65, 16}, 0, 4, 1},                       // padded vocabulary rows
      {{65, 16}, 0, 2, 1}, {{16, 24}, 1, 2, 1},  // row-parallel: columns
      {{16, 10}, 1, 4, 1},                       // padded columns
      {{48, 8}, 0, 2, 3},                        // fused qkv
      {{45, 8}, 0, 2, 3},                        // fused qkv, padded in every part
      {{32}, 0, 2, 1},                           // a 1-D bias
  };
  for (const InitCase& k : cases) {
    for (InitKind kind : {InitKind::normal, InitKind::ones, InitKind::zeros}) {
      SCOPED_TRACE(::testing::Message()
                   << to_string(k.logical) << " dim " << k.dim << ", ranks " << k.ranks
                   << ", parts " << k.parts << ", init " << static_cast<int>(kind));
      Parameter whole_p("transformer.h.0.attn.c_attn.weight", k.logical, kind, 0.02f);
      initialize(whole_p, kSeed);
      const std::span<const float> all = std::as_const(whole_p.value).span_f32();
      for (int r = 0; r < k.ranks; ++r) {
        Parameter shard("transformer.h.0.attn.c_attn.weight",
                        even_shard(k.logical, k.dim, r, k.ranks, k.parts), kind, 0.02f);
        // Garbage first: initialize() must overwrite everything, padding included.
        shard.value.fill(7.0f);
        initialize(shard, kSeed);
        const std::span<const float> mine = std::as_const(shard.value).span_f32();
        for (const ShardRun& run : runs_of(shard.shard)) {
          EXPECT_EQ(std::memcmp(mine.data() + run.local, all.data() + run.logical,
                                static_cast<std::size_t>(run.count) * sizeof(float)),
                    0)
              << "rank " << r << " run at local " << run.local;
        }
        const std::vector<bool> real = real_mask(shard.shard, shard.value.numel());
        for (std::size_t i = 0; i < real.size(); ++i) {
          if (!real[i]) {
            EXPECT_EQ(mine[i], 0.0f) << "padding element " << i << " of rank " << r;
          }
        }
        for (float g : std::as_const(shard.grad).span_f32()) ASSERT_EQ(g, 0.0f);
      }
    }
  }
}

TEST(ParameterShard, NormalValuesDependOnTheNameSoShardsOfDifferentTensorsDiffer) {
  Parameter a("a", even_shard({8, 4}, 0, 1, 2), InitKind::normal, 0.02f);
  Parameter b("b", even_shard({8, 4}, 0, 1, 2), InitKind::normal, 0.02f);
  initialize(a, 1);
  initialize(b, 1);
  EXPECT_NE(std::memcmp(a.value.f32(), b.value.f32(), 16 * sizeof(float)), 0);
}

TEST(ParameterShard, LocalShapeIsTheLogicalShapeWithThePaddedSplitDimension) {
  Parameter vocab("lm_head.weight", even_shard({65, 128}, 0, 3, 4), InitKind::normal, 0.02f);
  EXPECT_EQ(vocab.value.shape(), (Shape{17, 128}));
  EXPECT_EQ(vocab.grad.shape(), (Shape{17, 128}));
  Parameter qkv("c_attn.weight", even_shard({384, 128}, 0, 0, 2, 3), InitKind::normal, 0.02f);
  EXPECT_EQ(qkv.value.shape(), (Shape{192, 128}));
  Parameter proj("c_proj.weight", even_shard({128, 512}, 1, 1, 4), InitKind::normal, 0.02f);
  EXPECT_EQ(proj.value.shape(), (Shape{128, 128}));
}

TEST(ParameterShard, IsShardedOnlyWhenTheRankHoldsLessThanTheWholeTensor) {
  EXPECT_FALSE(Parameter("w", Shape{8, 4}, InitKind::zeros).is_sharded());
  EXPECT_FALSE(Parameter("b", Shape{8}, InitKind::zeros).is_sharded());
  EXPECT_FALSE(Parameter("w", even_shard({8, 4}, 0, 0, 1), InitKind::zeros).is_sharded());
  EXPECT_FALSE(Parameter("qkv", even_shard({12, 4}, 0, 0, 1, 3), InitKind::zeros).is_sharded());
  EXPECT_TRUE(Parameter("w", even_shard({8, 4}, 0, 1, 2), InitKind::zeros).is_sharded());
  EXPECT_TRUE(Parameter("w", even_shard({8, 4}, 1, 0, 2), InitKind::zeros).is_sharded());
  EXPECT_TRUE(Parameter("qkv", even_shard({12, 4}, 0, 1, 2, 3), InitKind::zeros).is_sharded());
  EXPECT_TRUE(Parameter("v", even_shard({65, 4}, 0, 3, 4), InitKind::zeros).is_sharded());
  EXPECT_TRUE(Parameter("v", even_shard({65, 4}, 0, 0, 4), InitKind::zeros).is_sharded());
}

TEST(ParameterShard, LogicalNumelCountsTheWholeTensorWithoutPadding) {
  const Parameter whole_p("w", Shape{65, 128}, InitKind::zeros);
  EXPECT_EQ(whole_p.logical_numel(), 65 * 128);
  EXPECT_EQ(whole_p.value.numel(), 65 * 128);
  const Parameter last("w", even_shard({65, 128}, 0, 3, 4), InitKind::zeros);
  EXPECT_EQ(last.logical_numel(), 65 * 128);
  EXPECT_EQ(last.value.numel(), 17 * 128);  // 14 real rows + 3 padding rows
  const Parameter qkv("qkv", even_shard({384, 128}, 0, 1, 2, 3), InitKind::zeros);
  EXPECT_EQ(qkv.logical_numel(), 384 * 128);
  EXPECT_EQ(qkv.value.numel(), 192 * 128);
}

}  // namespace
}  // namespace meshtrain
