// src/meshtrain/core/rng.h
//
// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011, "Parallel Random Numbers:
// As Easy as 1, 2, 3", through Random123). A value is a pure function of (seed, stream,
// index): no state to carry, so a parameter's initial element i is the same whichever rank
// owns it (DESIGN invariant 1) and a sampler's draw for step s needs no history (invariant 2).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace meshtrain {

/// 64-bit stream id of a name (xxHash XXH64 with seed 0), e.g. a parameter name.
std::uint64_t stream_of(std::string_view name);

/// Four independent 32-bit words for counter (stream, index) under key seed.
struct PhiloxWords {
  std::uint32_t w[4];
};
PhiloxWords philox(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

/// Uniform in [0, 2^64) — two words of philox(seed, stream, index).
std::uint64_t philox_u64(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

/// Standard normal for element `index` (Box–Muller on two 32-bit uniforms of the counter).
float philox_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

/// out[i] = mean + std · philox_normal(seed, stream, first_index + i). A shard passes the
/// global index of its first element, so shards are slices of one logical tensor.
void fill_normal(std::span<float> out, std::uint64_t seed, std::uint64_t stream,
                 std::uint64_t first_index, float mean, float std);

}  // namespace meshtrain
