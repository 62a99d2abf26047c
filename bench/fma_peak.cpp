// bench/fma_peak.cpp
//
// This core's measured arithmetic peak: f32 FMA FLOP/s with AVX-512 (vfmadd231ps on zmm
// registers, 16 lanes × 2 FLOP per instruction), or with AVX2 + FMA on a CPU without AVX-512F
// (ymm registers, 8 lanes; e.g. AMD Zen 1–3), and, where the CPU has AVX512_BF16, the bf16
// dot-product rate (vdpbf16ps: 16 f32 lanes, each 2 bf16 products summed into the accumulator,
// 4 FLOP per lane per instruction). The MFU of bench/scaling_bench.sh is stated against these
// figures as well as against training.peak_flops_per_core (2.19e11, DESIGN machine notes).
// Where the CPU has AMX-BF16 (and Linux grants the tile state, arch_prctl ARCH_REQ_XCOMP_PERM)
// also the AMX rate: tdpbf16ps on four independent 16 × 16 f32 accumulator tiles, 16 × 16 ×
// 32 products = 16,384 FLOP per instruction (Intel SDM, "Intel AMX"), the unit oneDNN's bf16
// GEMMs and the attention core's bf16 tiles run on there.
//
//   fma_peak [--json] [--seconds S] [--windows N]
//
// One thread. Each window runs independent accumulator chains (more chains than FMA latency ×
// FMA ports, so the loop is throughput-bound, not latency-bound) for ≥ S seconds (default 0.2)
// of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so time other processes take the core
// from it on a shared machine does not count; the figure reported is the best of N windows
// (default 5): a peak is the fastest the core was seen to go. --json prints only
// {"f32_flops": …, "f32_isa": "avx512" or "avx2", "bf16_flops": … or null, "amx_bf16_flops":
// … or null, "windows": N, "seconds": S}. Exit 2 on a bad argument, 1 when the CPU has neither
// AVX-512F nor AVX2 + FMA.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <sys/syscall.h>
#include <unistd.h>

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

// The same on ymm registers, 12 chains: AVX2 has 16 of them (12 accumulators + 2 operands
// stay in registers), and 12 ≥ 5-cycle latency × 2 FMA ports.
constexpr int kChains256 = 12;
__attribute__((target("avx2,fma"))) float fma_batch_avx2(std::int64_t batches) {
  __m256 acc[kChains256];
  for (int c = 0; c < kChains256; ++c) acc[c] = _mm256_set1_ps(0.001f * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < batches * kInnerIters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains256; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  alignas(32) float lanes[8];
  float total = 0.0f;
  for (const __m256& v : acc) {
    _mm256_store_ps(lanes, v);
    for (const float x : lanes) total += x;
  }
  return total;
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

// Tile configuration (palette 1): tmm0–3 accumulators, tmm4–5 A, tmm6–7 B, 16 × 64 bytes each.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

bool amx_granted() {
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // asm/prctl.h, XFEATURE_XTILEDATA
  return __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
         syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

// kInnerIters × 4 tdpbf16ps per batch on 4 independent accumulators (zero operands: the rate
// does not depend on the values).
__attribute__((target("amx-tile,amx-bf16"))) float amx_batch(std::int64_t batches) {
  static const TileConfig config;
  alignas(64) static const std::uint8_t zeros[16 * 64] = {};
  alignas(64) float out[16 * 16];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  for (std::int64_t i = 0; i < batches * kInnerIters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

volatile float g_sink = 0.0f;  // keeps the batches' results alive

/// Best FLOP/s over `windows` windows of ≥ `seconds` thread CPU seconds; each window doubles
/// its batch count until one batch run lasts long enough, so the clock is read rarely.
/// flops_per_iteration: FLOPs of one of a batch's kInnerIters iterations.
template <typename Batch>
double best_flops(Batch batch, double flops_per_iteration, double seconds, int windows) {
  const double flops_per_batch = flops_per_iteration * static_cast<double>(kInnerIters);
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
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    std::fprintf(stderr, "fma_peak: this CPU has neither AVX-512F nor AVX2 + FMA\n");
    return 1;
  }
  const double f32 = avx512 ? best_flops(fma_batch, 2.0 * 16 * kChains, seconds, windows)
                            : best_flops(fma_batch_avx2, 2.0 * 8 * kChains256, seconds, windows);
  const bool has_bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  const double bf16 = has_bf16 ? best_flops(bf16_batch, 4.0 * 16 * kChains, seconds, windows) : 0.0;
  const bool has_amx = amx_granted();
  const double amx = has_amx ? best_flops(amx_batch, 4.0 * 16384, seconds, windows) : 0.0;
  if (json) {
    const auto field = [](bool has, double v) {
      if (has) {
        std::printf("%.6g", v);
      } else {
        std::printf("null");
      }
    };
    std::printf("{\"f32_flops\": %.6g, \"f32_isa\": \"%s\", \"bf16_flops\": ", f32,
                avx512 ? "avx512" : "avx2");
    field(has_bf16, bf16);
    std::printf(", \"amx_bf16_flops\": ");
    field(has_amx, amx);
    std::printf(", \"windows\": %d, \"seconds\": %g}\n", windows, seconds);
  } else {
    std::printf("fma_peak: 1 thread, best of %d windows of ≥ %g s thread CPU time\n", windows,
                seconds);
    std::printf("f32 FMA (%s, vfmadd231ps):   %8.1f GFLOP/s\n", avx512 ? "AVX-512" : "AVX2",
                f32 * 1e-9);
    if (has_bf16) {
      std::printf("bf16 dot (AVX512_BF16, vdpbf16ps): %8.1f GFLOP/s\n", bf16 * 1e-9);
    } else {
      std::printf("bf16 dot: this CPU has no AVX512_BF16\n");
    }
    if (has_amx) {
      std::printf("bf16 AMX (tdpbf16ps tiles):        %8.1f GFLOP/s\n", amx * 1e-9);
    } else {
      std::printf("bf16 AMX: this CPU (or kernel) has no AMX-BF16\n");
    }
  }
  return 0;
}
