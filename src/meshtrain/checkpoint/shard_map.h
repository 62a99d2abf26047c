// src/meshtrain/checkpoint/shard_map.h
//
// Where a piece of a parameter sits in its logical tensor, and the copy between two pieces of
// different layouts: the arithmetic behind resharding. A checkpoint stores each rank's pieces
// as they are (no gather at save time); a rank loading under another layout (tp, pp, dp, ZeRO
// stage) fills each of its own pieces from every stored piece that overlaps it in logical
// coordinates. The same rule as PyTorch Distributed Checkpoint's load-time resharding
// (torch.distributed.checkpoint: save each rank's shards with their offsets, plan reads by
// overlap), applied to meshtrain's two-level sharding.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// Elements [begin, end) of the flattened local tensor of the tp shard `slice` (row-major,
/// padding included): a whole tp shard (ZeRO-0: begin 0, end = its numel), or a ZeRO rank's
/// flat slice of it.
struct ShardPiece {
  ShardSlice slice;
  std::int64_t begin = 0;
  std::int64_t end = 0;

  bool operator==(const ShardPiece&) const = default;
};

/// The piece's real (non-padding) elements as runs in increasing logical order: `local` is
/// relative to `begin`, `logical` the row-major index in the logical tensor.
std::vector<ShardRun> logical_runs(const ShardPiece& piece);

/// Elements of the piece that belong to the logical tensor (padding excluded).
std::int64_t real_elements(const ShardPiece& piece);

/// Copies every element both pieces hold, matched by logical index, from `from` (f32,
/// end − begin elements of `src`) into `to` (f32, end − begin of `dst`); elements of `dst`
/// that `src` does not hold are left alone. Returns the elements copied. Both pieces must be
/// of one logical shape (MT_CHECK; the caller matched them by parameter name and checked the
/// shapes).
std::int64_t copy_overlap(const ShardPiece& src, std::span<const float> from, const ShardPiece& dst,
                          std::span<float> to);

/// The same, marking each element of `to` it writes in `written` (one byte per element of
/// dst, 0 = not yet): a checkpoint whose pieces overlap would write an element twice, which
/// throws DataError ("pieces overlap") instead of loading whichever piece came last.
std::int64_t copy_overlap(const ShardPiece& src, std::span<const float> from, const ShardPiece& dst,
                          std::span<float> to, std::span<std::uint8_t> written);

}  // namespace meshtrain
