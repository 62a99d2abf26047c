// tests/support/bitwise.h — bitwise comparison of float arrays, for the unit tests that promise
// "bitwise equal" (fused against unfused kernels, written-out summation orders, thread counts).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "meshtrain/core/rng.h"

namespace meshtrain::test {

/// Bitwise equality of two float arrays (memcmp: +0/−0 and NaN payloads count too); the
/// failure names the first differing element.
inline ::testing::AssertionResult same_bits(const std::vector<float>& a,
                                            const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " vs " << b[i] << " (of " << a.size() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

/// n values from N(mean, stddev²), from Philox stream `name` of `seed` (each test file picks
/// its seed, so its inputs do not depend on another file's).
inline std::vector<float> randn(std::uint64_t seed, std::size_t n, std::string_view name,
                                float stddev = 1.0f, float mean = 0.0f) {
  std::vector<float> v(n);
  fill_normal(v, seed, stream_of(name), 0, mean, stddev);
  return v;
}

}  // namespace meshtrain::test
