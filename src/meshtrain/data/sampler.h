// src/meshtrain/data/sampler.h
//
// The global-batch sampler of DESIGN invariant 2: the sequences of global batch `step` are a
// pure function of (seed, split, step), drawn with the counter-based Philox generator, so no
// state is carried between steps (resuming at step s needs only s, mid-epoch too) and no
// rank's view depends on the mesh. Which rank fills which sequences is first_sequence_of's
// fixed rule. Uses: core/rng.h, token_file.h, epoch_sampler.h. Takes dp rank and size as
// integers, not a process group.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

#include "meshtrain/data/epoch_sampler.h"
#include "meshtrain/data/token_file.h"

namespace meshtrain::data {

/// Which window global sample i = s·global_batch + g is (docs/data.md, "Samplers").
enum class SampleOrder : std::uint8_t {
  /// nanoGPT's get_batch (train.py): a uniformly random start,
  ///   offset(i) = philox_u64(seed, stream_of(split_name), i) mod (n − seq_len)
  random,
  /// Every window once per epoch, in a seeded permutation per epoch (epoch_sampler.h):
  ///   offset(i) = EpochOrder(window_count(n, seq_len), seed, stream_of(split_name))
  ///                 .window_of(i) · seq_len
  epoch,
};

/// Draws the sequences of each global batch from one token file (uint16 or uint32 ids).
///
/// Sequence g of step s (0 ≤ g < global_batch) is global sample i = s·global_batch + g; it
/// starts at offset(i) (SampleOrder above, n = tokens in the file) and holds
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
                     std::uint64_t seed, std::string_view split_name,
                     SampleOrder order = SampleOrder::random);

  /// Start of sequence `sequence` of step `step`, in [0, n − seq_len). step ≥ 0,
  /// 0 ≤ sequence < global_batch.
  std::int64_t offset_of(std::int64_t step, std::int64_t sequence) const;

  /// Epochs completed after `samples` global samples, a fraction (samples / windows, with
  /// windows = window_count(n, seq_len)); for the log and metrics. Defined for both orders.
  double epochs_after(std::int64_t samples) const;

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
  SampleOrder order() const noexcept { return order_; }

 private:
  TokenSpan tokens_;
  std::filesystem::path path_;  // for messages
  std::int64_t seq_len_;
  std::int64_t global_batch_;
  std::uint64_t seed_;
  std::uint64_t stream_;
  SampleOrder order_;
  std::optional<EpochOrder> epoch_;  // SampleOrder::epoch only
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
