// src/meshtrain/mesh/shard_slice.h
//
// A rank's slice of one logical tensor along one dimension, and Megatron-LM's even split that
// produces it. The placement table (mesh/placement.h) hands every parameter its slice; layers,
// checkpoints and the offline reshard read slices, never rank arithmetic of their own.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/core/tensor.h"

namespace meshtrain {

/// Where a rank's tensor sits in the logical parameter. Dimension `dim` of the logical tensor
/// is `parts` equal consecutive blocks (1 normally; 3 for GPT-2's fused c_attn [q; k; v], whose
/// shard must hold the same heads of q, k and v). In every block the rank holds logical indices
/// [offset, offset + length) and stores them as the first `length` of `stride` consecutive
/// entries of its own dimension `dim`; entries [length, stride) are padding (a vocabulary not
/// divisible by tp), always zero, never part of the logical tensor. Every other dimension is
/// whole. Local shape = logical shape with dimension `dim` set to parts·stride.
struct ShardSlice {
  int dim = 0;
  std::int64_t parts = 1;
  std::int64_t offset = 0;
  std::int64_t length = 0;
  std::int64_t stride = 0;
  Shape logical_shape;

  bool operator==(const ShardSlice&) const = default;
};

/// The whole of `logical` (a parameter replicated over its group).
ShardSlice whole(const Shape& logical);

/// Megatron-LM's even split (Shoeybi et al. 2019, §3): each of the `parts` blocks of dimension
/// `dim` (n entries each) is cut into `ranks` pieces of ceil(n / ranks); rank r holds
/// [r·piece, min((r+1)·piece, n)) padded to `piece` entries. So every rank's tensor has the
/// same shape, only the last ranks carry padding, and without padding it is the plain slice.
/// MT_CHECKs 0 ≤ rank < ranks and that `parts` divides the dimension.
ShardSlice even_shard(const Shape& logical, int dim, int rank, int ranks, std::int64_t parts = 1);

/// A contiguous run of a shard's real (non-padding) elements: `count` elements starting at
/// element `local` of the rank's tensor and at element `logical` of the logical tensor
/// (row-major numbering of each).
struct ShardRun {
  std::int64_t local;
  std::int64_t logical;
  std::int64_t count;
};
/// Every run of `slice`, in increasing local order; together they cover each real element once.
std::vector<ShardRun> runs_of(const ShardSlice& slice);

}  // namespace meshtrain
