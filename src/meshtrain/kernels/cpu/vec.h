// src/meshtrain/kernels/cpu/vec.h
//
// Private to kernels/cpu: the native float vector as a GCC vector extension (`vector_size`),
// so one source serves AVX-512 (16 floats under -march=native with __AVX512F__), AVX/AVX2 (8)
// and anything else (4), its loads and stores, whole and partial, and element-wise loops over
// whole vectors with the tail in one partial vector.
#pragma once

#include <cstdint>
#include <cstring>

#include "meshtrain/kernels/cpu/cpu_util.h"

namespace meshtrain::kernels::cpu {

/// Floats in one native vector register.
#if defined(__AVX512F__)
inline constexpr std::int64_t kLanes = 16;
#elif defined(__AVX__)
inline constexpr std::int64_t kLanes = 8;
#else  // SSE, NEON: 16-byte registers (a wider vector_size would also warn -Wpsabi there)
inline constexpr std::int64_t kLanes = 4;
#endif

/// N floats as one GCC vector.
template <std::int64_t N>
using FloatVec [[gnu::vector_size(N * sizeof(float))]] = float;

/// Lanes of a float vector type V.
template <typename V>
inline constexpr std::int64_t lanes_of = static_cast<std::int64_t>(sizeof(V) / sizeof(float));

template <std::int64_t N>
inline FloatVec<N> load_vec(const float* p) {
  FloatVec<N> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <std::int64_t N>
inline void store_vec(float* p, const FloatVec<N>& v) {
  std::memcpy(p, &v, sizeof v);
}

/// The first `count` floats at p (0 ≤ count ≤ N) in the low lanes, 0 in the others: a row's
/// tail goes through the same vector code as its body, so every element of a row gets the
/// same operations whatever its position.
template <std::int64_t N>
inline FloatVec<N> load_partial(const float* p, std::int64_t count) {
  FloatVec<N> v{};
  std::memcpy(&v, p, static_cast<std::size_t>(count) * sizeof(float));
  return v;
}
/// Stores the low `count` lanes of v at p (0 ≤ count ≤ N); nothing past p + count is written.
template <std::int64_t N>
inline void store_partial(float* p, const FloatVec<N>& v, std::int64_t count) {
  std::memcpy(p, &v, static_cast<std::size_t>(count) * sizeof(float));
}

/// count (1..kLanes) floats at p as a native vector, 0 in the lanes past count; with count a
/// constant kLanes (the loops below) this folds to one load.
inline FloatVec<kLanes> load_lanes(const float* p, std::int64_t count) {
  return count == kLanes ? load_vec<kLanes>(p) : load_partial<kLanes>(p, count);
}
/// Stores the low count (1..kLanes) lanes of v at p.
inline void store_lanes(float* p, const FloatVec<kLanes>& v, std::int64_t count) {
  if (count == kLanes) {
    store_vec<kLanes>(p, v);
  } else {
    store_partial<kLanes>(p, v, count);
  }
}

/// body(i, count) for the native vectors of [0, n): whole ones (count = kLanes), then the
/// partial tail. With load_lanes and store_lanes the body gives every element the same
/// operations wherever it lies, where a vectorised loop's scalar tail may round differently
/// (another contraction into FMAs) and keep a different code path. Capture by value in the
/// body, for the reason parallel_vectors gives.
template <typename Body>
inline void for_each_vector(std::int64_t n, Body&& body) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) body(i, kLanes);
  if (i < n) body(i, n - i);
}

/// for_each_vector over n floats with the whole vectors split statically across the OpenMP
/// threads (on the calling thread below kParallelGrain elements), the tail on the caller.
///
/// Write the body to capture by value ([=]) and each thread runs its own copy of it: the
/// vector stores are memcpy, which may alias anything whose address has escaped, so pointers
/// reached through a shared closure (or captured by reference) would be reloaded from memory
/// after every store; a private copy's members stay in registers.
template <typename Body>
inline void parallel_vectors(std::int64_t n, const Body& body) {
  const std::int64_t whole = n / kLanes;
#pragma omp parallel if (n >= kParallelGrain)
  {
    Body own = body;
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < whole; ++b) own(b * kLanes, kLanes);
  }
  if (whole * kLanes < n) body(whole * kLanes, n - whole * kLanes);
}

}  // namespace meshtrain::kernels::cpu
