#include "meshtrain/checkpoint/shard_map.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/core/error.h"

namespace meshtrain {

std::vector<ShardRun> logical_runs(const ShardPiece& piece) {
  std::vector<ShardRun> out;
  for (const ShardRun& run : runs_of(piece.slice)) {
    const std::int64_t lo = std::max(run.local, piece.begin);
    const std::int64_t hi = std::min(run.local + run.count, piece.end);
    if (lo >= hi) continue;
    out.push_back(
        {.local = lo - piece.begin, .logical = run.logical + (lo - run.local), .count = hi - lo});
  }
  // runs_of is in local order, which is logical order for every ShardSlice today; sorting
  // keeps the merge below correct whatever a future slice kind does.
  std::sort(out.begin(), out.end(),
            [](const ShardRun& a, const ShardRun& b) { return a.logical < b.logical; });
  return out;
}

std::int64_t real_elements(const ShardPiece& piece) {
  std::int64_t n = 0;
  for (const ShardRun& run : logical_runs(piece)) n += run.count;
  return n;
}

std::int64_t copy_overlap(const ShardPiece& src, std::span<const float> from, const ShardPiece& dst,
                          std::span<float> to) {
  return copy_overlap(src, from, dst, to, {});
}

std::int64_t copy_overlap(const ShardPiece& src, std::span<const float> from, const ShardPiece& dst,
                          std::span<float> to, std::span<std::uint8_t> written) {
  MT_CHECK(src.slice.logical_shape == dst.slice.logical_shape,
           "pieces of different logical shapes");
  MT_CHECK(static_cast<std::int64_t>(from.size()) == src.end - src.begin &&
               static_cast<std::int64_t>(to.size()) == dst.end - dst.begin,
           "piece buffers of the wrong size");
  const std::vector<ShardRun> a = logical_runs(src), b = logical_runs(dst);
  std::int64_t copied = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {  // both sorted by logical index: a merge
    const std::int64_t a_end = a[i].logical + a[i].count, b_end = b[j].logical + b[j].count;
    const std::int64_t lo = std::max(a[i].logical, b[j].logical), hi = std::min(a_end, b_end);
    if (lo < hi) {
      const std::int64_t at = b[j].local + (lo - b[j].logical);
      if (!written.empty()) {
        const auto first = written.begin() + at, last = first + (hi - lo);
        if (std::find(first, last, std::uint8_t{1}) != last) {
          throw DataError("two pieces of the checkpoint hold the same elements (pieces overlap)");
        }
        std::fill(first, last, std::uint8_t{1});
      }
      std::memcpy(to.data() + at, from.data() + a[i].local + (lo - a[i].logical),
                  static_cast<std::size_t>(hi - lo) * sizeof(float));
      copied += hi - lo;
    }
    if (a_end <= b_end) ++i;
    if (b_end <= a_end) ++j;
  }
  return copied;
}

}  // namespace meshtrain
