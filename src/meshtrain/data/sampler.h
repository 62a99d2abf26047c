// src/meshtrain/data/sampler.h
//
// The global-batch sampler of DESIGN invariant 2: the sequences of global batch `step` are a
// pure function of (seed, split, step), drawn with the counter-based Philox generator, so no
// state is carried between steps (resuming at step s needs only s) and no rank's view depends
// on the mesh. Which rank fills which sequences is first_sequence_of's fixed rule.
// Uses: core/rng.h, token_file.h. Takes dp rank and size as integers, not a process group.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

#include "meshtrain/data/token_file.h"

namespace meshtrain::data {

/// Draws nanoGPT-style random windows (get_batch in nanoGPT's train.py) from one token file.
///
/// Sequence g of step s (0 ≤ g < global_batch) starts at
///   offset(s, g) = philox_u64(seed, stream_of(split_name), s·global_batch + g) mod (n − seq_len)
/// with n = tokens in the file, and holds
///   inputs   tokens[offset, offset + seq_len)
///   targets  tokens[offset + 1, offset + seq_len + 1)   (the next token of each input)
/// The split name selects the Philox stream, so "train" and "val" never draw the same
/// sequence of offsets even from one seed.
class GlobalBatchSampler {
 public:
  /// `file` must outlive the sampler (only its mapping is referenced; moving the TokenFile is
  /// fine). seq_len ≥ 1 and global_batch ≥ 1 are the caller's to guarantee (config
  /// validation); a violation is a meshtrain bug and aborts through MT_CHECK.
  /// Errors: DataError naming the file when it holds fewer than seq_len + 1 tokens (one
  /// sequence plus its last target).
  GlobalBatchSampler(const TokenFile& file, std::int64_t seq_len, std::int64_t global_batch,
                     std::uint64_t seed, std::string_view split_name);

  /// Start of sequence `sequence` of step `step`, in [0, n − seq_len). step ≥ 0,
  /// 0 ≤ sequence < global_batch.
  std::int64_t offset_of(std::int64_t step, std::int64_t sequence) const;

  /// Writes sequences [first_sequence, first_sequence + count) of global batch `step`:
  ///   inputs   [count, seq_len]  i32, row r = sequence first_sequence + r
  ///   targets  [count, seq_len]  i32, inputs shifted left by one token
  /// Requires step ≥ 0, count ≥ 0 and 0 ≤ first_sequence ≤ first_sequence + count ≤
  /// global_batch (MT_CHECK). Allocates nothing; the ids are those of the file, which
  /// TokenFile validated against the vocabulary when given one.
  void fill(std::int64_t step, std::int64_t first_sequence, std::int64_t count,
            std::int32_t* inputs, std::int32_t* targets) const;

  std::int64_t seq_len() const noexcept { return seq_len_; }
  std::int64_t global_batch() const noexcept { return global_batch_; }

 private:
  std::span<const std::uint16_t> tokens_;
  std::filesystem::path path_;  // for messages
  std::int64_t seq_len_;
  std::int64_t global_batch_;
  std::uint64_t seed_;
  std::uint64_t stream_;
};

/// First sequence (of the global batch) that dp rank `dp_rank` fills at gradient-accumulation
/// step `accumulation_index`, with `micro_batch` sequences per micro-batch:
///   (accumulation_index · dp_size + dp_rank) · micro_batch
/// It fills [first, first + micro_batch). With global_batch = accumulation_steps · dp_size ·
/// micro_batch, the (accumulation_index, dp_rank) pairs tile [0, global_batch) exactly once,
/// so every layout trains on the same sequences and each sequence keeps its global index.
/// Requires accumulation_index ≥ 0, 0 ≤ dp_rank < dp_size, micro_batch ≥ 1 (MT_CHECK).
std::int64_t first_sequence_of(std::int64_t accumulation_index, int dp_rank, int dp_size,
                               std::int64_t micro_batch);

}  // namespace meshtrain::data
