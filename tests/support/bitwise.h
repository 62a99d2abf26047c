// tests/support/bitwise.h — bitwise comparison of float arrays, for the unit tests that promise
// "bitwise equal" (fused against unfused kernels, written-out summation orders, thread counts).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

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

}  // namespace meshtrain::test
