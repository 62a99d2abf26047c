// bench/fma_peak.cpp
//
// This core's measured arithmetic peak: f32 FMA FLOP/s with AVX-512 (vfmadd231ps on zmm
// registers, 16 lanes × 2 FLOP per instruction) and, where the CPU has AVX512_BF16, the bf16
// dot-product rate (vdpbf16ps: 16 f32 lanes, each 2 bf16 products summed into the accumulator,
// 4 FLOP per lane per instruction). The MFU of bench/scaling_bench.sh is stated against these
// figures as well as against training.peak_flops_per_core (2.19e11, DESIGN machine notes).
//
//   fma_peak [--json] [--seconds S] [--windows N]
//
// One thread. Each window runs independent accumulator chains (more chains than FMA latency ×
// FMA ports, so the loop is throughput-bound, not latency-bound) for ≥ S seconds (default 0.2)
// of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so time other processes take the core
// from it on a shared machine does not count; the figure reported is the best of N windows
// (default 5): a peak is the fastest the core was seen to go. --json prints only
// {"f32_flops": …, "bf16_flops": … or null, "windows": N, "seconds": S}. Exit 2 on a bad
// argument, 1 when the CPU lacks AVX-512F.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

constexpr int kChains = 16;                 // ≥ 4-cycle latency × 2 FMA ports, with room
constexpr std::int64_t kInnerIters = 4096;  // instructions per chain between clock reads

// The chains' lanes summed (by hand: GCC 12's _mm512_reduce_add_ps warns under -Wall).
__attribute__((target("avx512f"))) float sum_chains(const __m512 (&acc)[kChains]) {
  alignas(64) float lanes[16];
  float total = 0.0f;
  for (const __m512& v : acc) {
    _mm512_store_ps(lanes, v);
    for (const float x : lanes) total += x;
  }
  return total;
}

// One batch of kInnerIters × kChains FMAs; returns a value built from every chain so the
// compiler cannot drop any of them.
__attribute__((target("avx512f"))) float fma_batch(std::int64_t batches) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  // Multiplier just under 1 and a small addend: the values stay finite and normal.
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < batches * kInnerIters; ++i) {
    // Unrolled so the chains live in zmm registers, not in memory.
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  return sum_chains(acc);
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_batch(std::int64_t batches) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  for (std::int64_t i = 0; i < batches * kInnerIters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, x);
  }
  return sum_chains(acc);
}

volatile float g_sink = 0.0f;  // keeps the batches' results alive

/// Best FLOP/s over `windows` windows of ≥ `seconds` thread CPU seconds; each window doubles
/// its batch count until one batch run lasts long enough, so the clock is read rarely.
template <typename Batch>
double best_flops(Batch batch, double flops_per_instruction, double seconds, int windows) {
  const double flops_per_batch = flops_per_instruction * kChains * static_cast<double>(kInnerIters);
  g_sink = g_sink + batch(8);  // warm-up: the core's AVX-512 frequency licence settles
  double best = 0.0;
  for (int w = 0; w < windows; ++w) {
    for (std::int64_t batches = 1;; batches *= 2) {
      const double start = thread_cpu_s();
      g_sink = g_sink + batch(batches);
      const double elapsed = thread_cpu_s() - start;
      if (elapsed >= seconds) {
        best = std::max(best, flops_per_batch * static_cast<double>(batches) / elapsed);
        break;
      }
    }
  }
  return best;
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--json] [--seconds S > 0] [--windows N ≥ 1]\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  double seconds = 0.2;
  int windows = 5;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::strtod(argv[++i], &end);
      if (*end != '\0' || !(seconds > 0.0 && seconds <= 60.0)) return usage(argv[0]);
    } else if (std::strcmp(argv[i], "--windows") == 0 && i + 1 < argc) {
      const long n = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || n < 1 || n > 1000) return usage(argv[0]);
      windows = static_cast<int>(n);
    } else {
      return usage(argv[0]);
    }
  }
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "fma_peak: this CPU has no AVX-512F\n");
    return 1;
  }
  const double f32 = best_flops(fma_batch, 2.0 * 16, seconds, windows);
  const bool has_bf16 = __builtin_cpu_supports("avx512bf16");
  const double bf16 = has_bf16 ? best_flops(bf16_batch, 4.0 * 16, seconds, windows) : 0.0;
  if (json) {
    std::printf("{\"f32_flops\": %.6g, \"bf16_flops\": ", f32);
    if (has_bf16) {
      std::printf("%.6g", bf16);
    } else {
      std::printf("null");
    }
    std::printf(", \"windows\": %d, \"seconds\": %g}\n", windows, seconds);
  } else {
    std::printf("fma_peak: 1 thread, best of %d windows of ≥ %g s thread CPU time\n", windows,
                seconds);
    std::printf("f32 FMA (AVX-512, vfmadd231ps):   %8.1f GFLOP/s\n", f32 * 1e-9);
    if (has_bf16) {
      std::printf("bf16 dot (AVX512_BF16, vdpbf16ps): %8.1f GFLOP/s\n", bf16 * 1e-9);
    } else {
      std::printf("bf16 dot: this CPU has no AVX512_BF16\n");
    }
  }
  return 0;
}
