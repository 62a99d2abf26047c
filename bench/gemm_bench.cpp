// bench/gemm_bench.cpp
//
// GFLOP/s of meshtrain::kernels::gemm on the GEMMs of the main GPT job: for every linear
// layer (x [tokens, in] · Wᵀ, W [out, in]) the forward y = x·Wᵀ and the two backward GEMMs
// dx = dy·W and dW += dyᵀ·x, at 768 and 384 tokens per rank (C = 128: qkv 128→384, attention
// proj 128→128, MLP 128→512 and 512→128, lm_head 128→65).
//
//   gemm_bench [threads] [--json]
//
// threads defaults to 1. Prints one line per GEMM (median of 3 timed windows of ≥ 0.3 s
// each, after a warm-up) and the mean of the medians; with --json, stdout carries only
// {"gflops": mean} (the per-GEMM lines go to stderr) so scripts can parse it.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/kernels.h"

namespace {

struct Layer {
  const char* name;
  std::int64_t in;
  std::int64_t out;
};

struct Gemm {
  std::string label;
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  float beta;
};

constexpr double kMinSeconds = 0.3;  // per timed window
constexpr std::size_t kWindows = 3;

struct Result {
  double median, min, max;  // GFLOP/s over the windows
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double measure_gflops(const Gemm& g) {
  const auto size = [](std::int64_t rows, std::int64_t cols) {
    return static_cast<std::size_t>(rows * cols);
  };
  std::vector<float> a(size(g.m, g.k)), b(size(g.k, g.n)), c(size(g.m, g.n), 0.0f);
  meshtrain::fill_normal(a, 1, 1, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(b, 1, 2, 0, 0.0f, 1.0f);
  const auto call = [&] {
    meshtrain::kernels::gemm(a.data(), b.data(), c.data(), g.m, g.n, g.k, g.trans_a, g.trans_b,
                             1.0f, g.beta);
  };
  // Warm-up: creates and caches the primitive, faults in the pages, fills the caches.
  const auto warm_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5 || seconds_since(warm_start) < 0.05; ++i) call();

  // Timed: doubling batches until one lasts ≥ kMinSeconds, so the clock is read rarely.
  std::int64_t iters = 1;
  const double flops_per_call =
      2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) call();
    const double elapsed = seconds_since(start);
    if (elapsed >= kMinSeconds) return flops_per_call * static_cast<double>(iters) / elapsed * 1e-9;
    iters *= 2;
  }
}

/// Median of kWindows timed windows: on the 2-core machines a burst of someone else's work
/// (a compile, a test) can halve one window, and with 2 OpenMP threads a busy core stalls
/// the other thread at every barrier; the median ignores one such window.
Result measure(const Gemm& g) {
  std::array<double, kWindows> runs{};
  for (double& r : runs) r = measure_gflops(g);
  std::sort(runs.begin(), runs.end());
  return {runs[kWindows / 2], runs.front(), runs.back()};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else {
      char* end = nullptr;
      const long value = std::strtol(argv[i], &end, 10);
      if (end == argv[i] || *end != '\0' || value < 1 || value > 1024) {
        std::fprintf(stderr, "usage: %s [threads ≥ 1] [--json]\n", argv[0]);
        return 2;
      }
      threads = static_cast<int>(value);
    }
  }
  meshtrain::kernels::set_num_threads(threads);

  const Layer layers[] = {
      {"attn.qkv", 128, 384}, {"attn.proj", 128, 128}, {"mlp.fc", 128, 512},
      {"mlp.proj", 512, 128}, {"lm_head", 128, 65},
  };
  std::vector<Gemm> gemms;
  for (const std::int64_t tokens : {768, 384}) {
    for (const Layer& l : layers) {
      const std::string tag = std::string(l.name) + " tokens=" + std::to_string(tokens);
      // Shapes and transposes exactly as linear_forward / linear_backward call gemm.
      gemms.push_back({"fwd y=x*W^T     " + tag, tokens, l.out, l.in, false, true, 0.0f});
      gemms.push_back({"bwd dx=dy*W     " + tag, tokens, l.in, l.out, false, false, 0.0f});
      gemms.push_back({"bwd dW+=dy^T*x  " + tag, l.out, l.in, tokens, true, false, 1.0f});
    }
  }

  FILE* lines = json ? stderr : stdout;
  std::fprintf(lines,
               "gemm_bench: %d thread(s); per GEMM the median (min..max) of %zu windows of "
               "≥ %.1f s\n",
               threads, kWindows, kMinSeconds);
  double sum = 0.0;
  for (const Gemm& g : gemms) {
    const Result r = measure(g);
    sum += r.median;
    std::fprintf(lines, "%-40s M=%-4lld N=%-4lld K=%-4lld %8.1f GFLOP/s  (%.1f..%.1f)\n",
                 g.label.c_str(), static_cast<long long>(g.m), static_cast<long long>(g.n),
                 static_cast<long long>(g.k), r.median, r.min, r.max);
  }
  const double mean = sum / static_cast<double>(gemms.size());
  std::fprintf(lines, "mean over %zu GEMMs: %.1f GFLOP/s\n", gemms.size(), mean);
  if (json) std::printf("{\"gflops\": %.3f}\n", mean);
  return 0;
}
