// Tests of checkpoint/shard_map.h, the arithmetic of resharding: pieces of one layout (tp even
// shards, cut again into ZeRO flat slices) filled from the pieces of another layout give, for
// every real element, exactly the logical tensor's value, and padding is never written.
#include "meshtrain/checkpoint/shard_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

struct Layout {
  int dim;
  std::int64_t parts;
  int tp;
  int dp;  // ZeRO ranks cutting each tp shard's flattened tensor into ⌈n/dp⌉ slices
};

std::int64_t local_numel(const ShardSlice& s) {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < s.logical_shape.size(); ++d) {
    n *= static_cast<int>(d) == s.dim ? s.parts * s.stride : s.logical_shape[d];
  }
  return n;
}

// Every piece of `layout` over `shape`: tp even shards, each cut into dp flat slices (the
// last ones may be empty, as ZeroSharding's are).
std::vector<ShardPiece> pieces_of(const Shape& shape, const Layout& layout) {
  std::vector<ShardPiece> out;
  for (int t = 0; t < layout.tp; ++t) {
    const ShardSlice slice = even_shard(shape, layout.dim, t, layout.tp, layout.parts);
    const std::int64_t n = local_numel(slice);
    const std::int64_t s = (n + layout.dp - 1) / layout.dp;
    for (int r = 0; r < layout.dp; ++r) {
      out.push_back({.slice = slice, .begin = std::min(n, r * s), .end = std::min(n, (r + 1) * s)});
    }
  }
  return out;
}

// The values a piece holds when the logical tensor's element i is i + 0.5; padding −1.
std::vector<float> values_of(const ShardPiece& piece) {
  std::vector<float> v(static_cast<std::size_t>(piece.end - piece.begin), -1.0f);
  for (const ShardRun& run : logical_runs(piece)) {
    for (std::int64_t i = 0; i < run.count; ++i) {
      v[static_cast<std::size_t>(run.local + i)] = static_cast<float>(run.logical + i) + 0.5f;
    }
  }
  return v;
}

TEST(ShardMap, EveryLayoutFillsEveryOtherLayoutExactly) {
  // A padded vocabulary-like [65, 6] matrix and a fused [3·8, 5] c_attn-like one (3 parts).
  const std::vector<std::pair<Shape, std::vector<Layout>>> cases = {
      {{65, 6},
       {{0, 1, 1, 1}, {0, 1, 2, 1}, {0, 1, 4, 3}, {1, 1, 3, 2}, {0, 1, 1, 4}, {1, 1, 2, 5}}},
      {{24, 5}, {{0, 3, 1, 1}, {0, 3, 2, 2}, {0, 3, 4, 3}, {1, 1, 5, 1}, {0, 1, 1, 7}}},
  };
  int checked = 0;
  for (const auto& [shape, layouts] : cases) {
    for (const Layout& from : layouts) {
      const std::vector<ShardPiece> src = pieces_of(shape, from);
      std::vector<std::vector<float>> src_values;
      for (const ShardPiece& p : src) src_values.push_back(values_of(p));
      for (const Layout& to : layouts) {
        for (const ShardPiece& dst : pieces_of(shape, to)) {
          std::vector<float> got(static_cast<std::size_t>(dst.end - dst.begin), -7.0f);
          std::int64_t copied = 0;
          for (std::size_t i = 0; i < src.size(); ++i) {
            copied += copy_overlap(src[i], src_values[i], dst, got);
          }
          EXPECT_EQ(copied, real_elements(dst));
          std::vector<float> want = values_of(dst);
          for (std::size_t i = 0; i < want.size(); ++i) {
            if (want[i] < 0.0f) want[i] = -7.0f;  // padding: never written
          }
          ASSERT_EQ(got, want) << "shape " << shape[0] << "×" << shape[1] << " from tp " << from.tp
                               << " dp " << from.dp << " to tp " << to.tp << " dp " << to.dp;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(ShardMap, RealElementsOfAllPiecesOfALayoutSumToTheLogicalTensor) {
  const Shape shape{65, 6};
  for (const Layout& l : {Layout{0, 1, 4, 3}, Layout{1, 1, 4, 5}, Layout{0, 1, 2, 8}}) {
    std::int64_t total = 0;
    for (const ShardPiece& p : pieces_of(shape, l)) total += real_elements(p);
    EXPECT_EQ(total, 65 * 6);
  }
}

TEST(ShardMap, LogicalRunsOfASliceStayInsideItsRange) {
  const ShardSlice slice = even_shard({10, 4}, 1, 1, 2);         // columns 2–3 of each row
  const ShardPiece piece{.slice = slice, .begin = 3, .end = 7};  // local (1,1) to (3,0)
  const std::vector<ShardRun> runs = logical_runs(piece);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].local, 0);  // local 3 = row 1, column 1 → logical 1·4 + 3 = 7
  EXPECT_EQ(runs[0].logical, 7);
  EXPECT_EQ(runs[0].count, 1);
  EXPECT_EQ(runs[1].logical, 10);  // row 2: logical 10, 11
  EXPECT_EQ(runs[1].count, 2);
  EXPECT_EQ(runs[2].logical, 14);  // row 3, first column only
  EXPECT_EQ(runs[2].count, 1);
}

TEST(ShardMap, OverlappingPiecesAreAnErrorNotALastWriteWins) {
  const Shape shape{4, 3};
  const ShardPiece whole_piece{.slice = whole(shape), .begin = 0, .end = 12};
  const ShardPiece first{.slice = whole(shape), .begin = 0, .end = 8};
  const ShardPiece again{.slice = whole(shape), .begin = 4, .end = 12};  // 4–7 twice
  std::vector<float> out(12, 0.0f), a(8, 1.0f), b(8, 2.0f);
  std::vector<std::uint8_t> written(12, 0);
  EXPECT_EQ(copy_overlap(first, a, whole_piece, out, written), 8);
  EXPECT_THROW(copy_overlap(again, b, whole_piece, out, written), DataError);
}

}  // namespace
}  // namespace meshtrain
