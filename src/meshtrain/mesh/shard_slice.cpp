#include "meshtrain/mesh/shard_slice.h"

#include <algorithm>

#include "meshtrain/core/error.h"

namespace meshtrain {

ShardSlice whole(const Shape& logical) {
  const std::int64_t n = logical.empty() ? 1 : logical[0];
  return ShardSlice{
      .dim = 0, .parts = 1, .offset = 0, .length = n, .stride = n, .logical_shape = logical};
}

ShardSlice even_shard(const Shape& logical, int dim, int rank, int ranks, std::int64_t parts) {
  MT_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {} ranks", rank, ranks);
  MT_CHECK(dim >= 0 && static_cast<std::size_t>(dim) < logical.size() && parts >= 1 &&
               logical[static_cast<std::size_t>(dim)] % parts == 0,
           "cannot split dim {} of {} in {} parts", dim, to_string(logical), parts);
  const std::int64_t n = logical[static_cast<std::size_t>(dim)] / parts;
  const std::int64_t piece = (n + ranks - 1) / ranks;
  const std::int64_t offset = std::min<std::int64_t>(rank * piece, n);
  return ShardSlice{.dim = dim,
                    .parts = parts,
                    .offset = offset,
                    .length = std::min(piece, n - offset),
                    .stride = piece,
                    .logical_shape = logical};
}

std::vector<ShardRun> runs_of(const ShardSlice& s) {
  const auto d = static_cast<std::size_t>(s.dim);
  std::int64_t inner = 1;  // elements per index of dimension `dim`
  for (std::size_t i = d + 1; i < s.logical_shape.size(); ++i) inner *= s.logical_shape[i];
  std::int64_t outer = 1;  // indices of the dimensions before `dim`
  for (std::size_t i = 0; i < d; ++i) outer *= s.logical_shape[i];
  const std::int64_t logical_dim = s.logical_shape.empty() ? 1 : s.logical_shape[d];
  const std::int64_t block = logical_dim / s.parts;
  std::vector<ShardRun> out;
  if (s.length == 0) return out;
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t p = 0; p < s.parts; ++p) {
      out.push_back({.local = (o * s.parts * s.stride + p * s.stride) * inner,
                     .logical = (o * logical_dim + p * block + s.offset) * inner,
                     .count = s.length * inner});
    }
  }
  return out;
}

}  // namespace meshtrain
