#include "meshtrain/core/rng.h"

#include <Random123/philox.h>
#include <xxhash.h>

#include <cmath>
#include <numbers>

namespace meshtrain {

std::uint64_t stream_of(std::string_view name) { return XXH64(name.data(), name.size(), 0); }

PhiloxWords philox(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  r123::Philox4x32 generator;
  const r123::Philox4x32::key_type key = {
      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
  const r123::Philox4x32::ctr_type counter = {
      {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
       static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}};
  const r123::Philox4x32::ctr_type r = generator(counter, key);
  return {{r[0], r[1], r[2], r[3]}};
}

std::uint64_t philox_u64(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const PhiloxWords r = philox(seed, stream, index);
  return (static_cast<std::uint64_t>(r.w[1]) << 32) | r.w[0];
}

float philox_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const PhiloxWords r = philox(seed, stream, index);
  // u1 in (0, 1] so log(u1) is finite; 2^-32 steps, computed in double for accuracy.
  const double u1 = (static_cast<double>(r.w[0]) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(r.w[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

void fill_normal(std::span<float> out, std::uint64_t seed, std::uint64_t stream,
                 std::uint64_t first_index, float mean, float std) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = mean + std * philox_normal(seed, stream, first_index + i);
  }
}

}  // namespace meshtrain
