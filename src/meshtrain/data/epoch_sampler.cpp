#include "meshtrain/data/epoch_sampler.h"

#include <algorithm>
#include <bit>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

namespace meshtrain::data {
namespace {

constexpr int kFeistelRounds = 4;  // Luby–Rackoff: four rounds give a pseudo-random permutation

}  // namespace

std::int64_t window_count(std::int64_t tokens, std::int64_t seq_len) {
  MT_CHECK(tokens >= 0, "tokens = {}, expected ≥ 0", tokens);
  MT_CHECK(seq_len >= 1, "seq_len = {}, expected ≥ 1", seq_len);
  return tokens < 1 ? 0 : (tokens - 1) / seq_len;
}

EpochOrder::EpochOrder(std::int64_t windows, std::uint64_t seed, std::uint64_t stream)
    : windows_(windows), seed_(seed), stream_(stream) {
  MT_CHECK(windows >= 1, "windows = {}, expected ≥ 1", windows);
  // Bits of the largest position, split into two halves of h bits (h ≥ 1), so the Feistel
  // domain [0, 2^(2h)) holds [0, windows) and is less than 4 · windows.
  const auto bits = static_cast<int>(std::bit_width(static_cast<std::uint64_t>(windows - 1)));
  half_bits_ = std::max(1, (bits + 1) / 2);
}

std::int64_t EpochOrder::epoch_of(std::int64_t sample) const {
  MT_CHECK(sample >= 0, "sample = {}, expected ≥ 0", sample);
  return sample / windows_;
}

std::int64_t EpochOrder::window_of(std::int64_t sample) const {
  return permute(epoch_of(sample), sample % windows_);
}

std::int64_t EpochOrder::permute(std::int64_t epoch, std::int64_t position) const {
  MT_CHECK(epoch >= 0, "epoch = {}, expected ≥ 0", epoch);
  MT_CHECK(position >= 0 && position < windows_, "position {} outside [0, {})", position, windows_);
  // Each epoch keys its own permutation; the key is one Philox value of (seed, split, epoch).
  const std::uint64_t epoch_key = philox_u64(seed_, stream_, static_cast<std::uint64_t>(epoch));
  // Cycle walking: the Feistel network permutes [0, 2^(2h)); applying it again until the
  // value falls inside [0, windows) restricts it to a permutation of [0, windows) (the walk
  // follows x's cycle, which returns to x itself at the latest).
  auto value = static_cast<std::uint64_t>(position);
  do {
    value = feistel(epoch_key, value);
  } while (value >= static_cast<std::uint64_t>(windows_));
  return static_cast<std::int64_t>(value);
}

std::uint64_t EpochOrder::feistel(std::uint64_t epoch_key, std::uint64_t value) const {
  const std::uint64_t mask = (std::uint64_t{1} << half_bits_) - 1;
  std::uint64_t left = value >> half_bits_, right = value & mask;
  for (std::uint64_t round = 0; round < kFeistelRounds; ++round) {
    // Round function: Philox under the epoch's key, counter (round, right half); h ≤ 32.
    const std::uint64_t f = philox_u64(epoch_key, stream_, (round << 32) | right);
    const std::uint64_t next = left ^ (f & mask);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

}  // namespace meshtrain::data
