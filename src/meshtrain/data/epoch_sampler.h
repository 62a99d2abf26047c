// src/meshtrain/data/epoch_sampler.h
//
// The epoch order of data.sampler = "epoch" (docs/data.md, "Samplers"): the corpus is cut
// into windows of seq_len + 1 tokens at stride seq_len (Megatron-LM's sample index, one
// sequence and its last target per window, consecutive windows sharing one token), and each
// epoch visits every window once in its own seeded permutation (Megatron-LM's shuffle index).
// Global sample i is window perm_e(i mod W) of epoch e = ⌊i / W⌋, a pure function of
// (seed, split, i): no state to carry or checkpoint, the same for every mesh.
//
// The permutation is stateless: a Feistel network keyed by Philox (Luby and Rackoff 1988:
// four rounds of a pseudo-random function make a pseudo-random permutation) on the smallest
// even number of bits 2h with 2^(2h) ≥ W, restricted to [0, W) by cycle walking (Black and
// Rogaway 2002, "Ciphers with arbitrary finite domains"). Memory O(1) whatever the corpus;
// cost per sample 4 Philox calls per walk step, fewer than 4 walk steps on average since
// 2^(2h) < 4·W. (Megatron materialises its shuffle index, 8 bytes per sample.)
// Uses: core/rng.h.
#pragma once

#include <cstdint>

namespace meshtrain::data {

/// Windows of seq_len + 1 tokens at stride seq_len in a file of `tokens` tokens:
/// ⌊(tokens − 1) / seq_len⌋ (Megatron-LM's (tokens_per_epoch − 1) // seq_length). Window w
/// starts at token w · seq_len. The last (tokens − 1) mod seq_len tokens are in no window.
/// Requires tokens ≥ 0 and seq_len ≥ 1 (MT_CHECK).
std::int64_t window_count(std::int64_t tokens, std::int64_t seq_len);

/// The windows of one split, in a new order every epoch.
class EpochOrder {
 public:
  /// `windows` ≥ 1 (MT_CHECK); `stream` names the split (core/rng.h's stream_of).
  EpochOrder(std::int64_t windows, std::uint64_t seed, std::uint64_t stream);

  std::int64_t windows() const noexcept { return windows_; }

  /// Epoch of global sample `sample` (≥ 0): ⌊sample / windows⌋.
  std::int64_t epoch_of(std::int64_t sample) const;

  /// Window of global sample `sample` (≥ 0): permute(epoch_of(sample), sample mod windows).
  std::int64_t window_of(std::int64_t sample) const;

  /// Position `position` of epoch `epoch`'s permutation: for each epoch ≥ 0 a bijection of
  /// [0, windows) onto itself. MT_CHECK on arguments outside those ranges.
  std::int64_t permute(std::int64_t epoch, std::int64_t position) const;

 private:
  std::uint64_t feistel(std::uint64_t epoch_key, std::uint64_t value) const;

  std::int64_t windows_;
  std::uint64_t seed_;
  std::uint64_t stream_;
  int half_bits_;  // h: each Feistel half holds h bits
};

}  // namespace meshtrain::data
