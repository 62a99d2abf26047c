// bench/gemm_bench.cpp
//
// GFLOP/s of meshtrain::kernels::gemm on the GEMMs of the main GPT job: for every linear
// layer (x [tokens, in] · Wᵀ, W [out, in]) the forward y = x·Wᵀ and the two backward GEMMs
// dx = dy·W and dW += dyᵀ·x, at 768 and 384 tokens per rank (C = 128: qkv 128→384, attention
// proj 128→128, MLP 128→512 and 512→128, lm_head 128→65). Each GEMM is timed with f32
// operands (kernels::gemm) and with the bf16 and f16 operands of mixed precision
// (kernels::gemm_16bit: f32 accumulation and output; f16 runs as widened f32 with Debian's
// oneDNN 2.6, which has no f16 CPU matmul), side by side.
//
//   gemm_bench [threads] [--json] [--dtypes f32,bf16,f16] [--cpu-time]
//
// threads defaults to 1, --dtypes to all three; --cpu-time (1 thread only) times by the
// thread's CPU clock instead of the wall clock, for a machine shared with other jobs. Prints one
// line per GEMM (per dtype the median of 3 timed windows of ≥ 0.3 s each, after a warm-up, and its
// ratio to f32) and the mean of the medians per dtype; with --json, stdout carries only {"gflops":
// f32 mean, "gflops_bf16": …, "gflops_f16": …} (the dtypes measured; per-GEMM lines go to stderr)
// so scripts can parse it.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "meshtrain/core/half.h"
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

// --cpu-time: this thread's CPU seconds instead of wall seconds. With 1 thread every GEMM runs
// on the calling thread, so the time other processes take the core from it does not count: a
// usable figure on a shared machine (the caches are still shared).
bool g_cpu_time = false;

double now_s() {
  if (g_cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double seconds_since(double start) { return now_s() - start; }

double measure_gflops(const Gemm& g, meshtrain::DType dtype) {
  const auto size = [](std::int64_t rows, std::int64_t cols) {
    return static_cast<std::size_t>(rows * cols);
  };
  std::vector<float> a(size(g.m, g.k)), b(size(g.k, g.n)), c(size(g.m, g.n), 0.0f);
  meshtrain::fill_normal(a, 1, 1, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(b, 1, 2, 0, 0.0f, 1.0f);
  std::vector<std::uint16_t> a16(a.size()), b16(b.size());
  if (dtype != meshtrain::DType::f32) {
    meshtrain::cast_f32_to_16bit(a.data(), a16.data(), static_cast<std::int64_t>(a.size()), dtype);
    meshtrain::cast_f32_to_16bit(b.data(), b16.data(), static_cast<std::int64_t>(b.size()), dtype);
  }
  const auto call = [&] {
    if (dtype == meshtrain::DType::f32) {
      meshtrain::kernels::gemm(a.data(), b.data(), c.data(), g.m, g.n, g.k, g.trans_a, g.trans_b,
                               1.0f, g.beta);
    } else {
      meshtrain::kernels::gemm_16bit(a16.data(), b16.data(), c.data(), g.m, g.n, g.k, g.trans_a,
                                     g.trans_b, 1.0f, g.beta, dtype);
    }
  };
  // Warm-up: creates and caches the primitive, faults in the pages, fills the caches.
  const double warm_start = now_s();
  for (int i = 0; i < 5 || seconds_since(warm_start) < 0.05; ++i) call();

  // Timed: doubling batches until one lasts ≥ kMinSeconds, so the clock is read rarely.
  std::int64_t iters = 1;
  const double flops_per_call =
      2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  for (;;) {
    const double start = now_s();
    for (std::int64_t i = 0; i < iters; ++i) call();
    const double elapsed = seconds_since(start);
    if (elapsed >= kMinSeconds) return flops_per_call * static_cast<double>(iters) / elapsed * 1e-9;
    iters *= 2;
  }
}

/// Median of kWindows timed windows: on the 2-core machines a burst of someone else's work
/// (a compile, a test) can halve one window, and with 2 OpenMP threads a busy core stalls
/// the other thread at every barrier; the median ignores one such window.
Result measure(const Gemm& g, meshtrain::DType dtype) {
  std::array<double, kWindows> runs{};
  for (double& r : runs) r = measure_gflops(g, dtype);
  std::sort(runs.begin(), runs.end());
  return {runs[kWindows / 2], runs.front(), runs.back()};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  bool json = false;
  std::vector<meshtrain::DType> dtypes{meshtrain::DType::f32, meshtrain::DType::bf16,
                                       meshtrain::DType::f16};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else if (std::strcmp(argv[i], "--dtypes") == 0 && i + 1 < argc) {
      dtypes.clear();
      const std::string list = argv[++i];
      for (const meshtrain::DType d :
           {meshtrain::DType::f32, meshtrain::DType::bf16, meshtrain::DType::f16}) {
        if (list.find(meshtrain::to_string(d)) != std::string::npos) dtypes.push_back(d);
      }
      if (dtypes.empty() || dtypes.front() != meshtrain::DType::f32) {
        std::fprintf(stderr, "--dtypes must include f32 (the reference), got %s\n", list.c_str());
        return 2;
      }
    } else {
      char* end = nullptr;
      const long value = std::strtol(argv[i], &end, 10);
      if (end == argv[i] || *end != '\0' || value < 1 || value > 1024) {
        std::fprintf(stderr,
                     "usage: %s [threads ≥ 1] [--json] [--dtypes f32,bf16,f16] [--cpu-time]\n",
                     argv[0]);
        return 2;
      }
      threads = static_cast<int>(value);
    }
  }
  if (g_cpu_time && threads != 1) {
    std::fprintf(stderr, "--cpu-time needs 1 thread (it reads the calling thread's clock)\n");
    return 2;
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
               "gemm_bench: %d thread(s); GFLOP/s per GEMM, the median of %zu windows of "
               "≥ %.1f s (%s); (×) = ratio to f32\n",
               threads, kWindows, kMinSeconds, g_cpu_time ? "thread CPU time" : "wall clock");
  std::fprintf(lines, "%-40s %-18s", "GEMM", "shape");
  for (const meshtrain::DType d : dtypes) {
    const std::string name(meshtrain::to_string(d));
    std::fprintf(lines, " %8s%s", name.c_str(), d == meshtrain::DType::f32 ? "" : "        ");
  }
  std::fprintf(lines, "\n");
  std::vector<double> sums(dtypes.size(), 0.0);
  for (const Gemm& g : gemms) {
    std::fprintf(lines, "%-40s M=%-4lld N=%-4lld K=%-4lld", g.label.c_str(),
                 static_cast<long long>(g.m), static_cast<long long>(g.n),
                 static_cast<long long>(g.k));
    double f32 = 0.0;
    for (std::size_t i = 0; i < dtypes.size(); ++i) {
      const Result r = measure(g, dtypes[i]);
      sums[i] += r.median;
      if (i == 0) {
        f32 = r.median;
        std::fprintf(lines, " %8.1f", r.median);
      } else {
        std::fprintf(lines, " %8.1f (%.2f×)", r.median, r.median / f32);
      }
    }
    std::fprintf(lines, "\n");
  }
  const auto n = static_cast<double>(gemms.size());
  std::fprintf(lines, "mean over %zu GEMMs:", gemms.size());
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    std::fprintf(lines, "  %.*s %.1f GFLOP/s",
                 static_cast<int>(meshtrain::to_string(dtypes[i]).size()),
                 meshtrain::to_string(dtypes[i]).data(), sums[i] / n);
    if (i > 0) std::fprintf(lines, " (%.2f×)", sums[i] / sums[0]);
  }
  std::fprintf(lines, "\n");
  if (json) {
    std::printf("{\"gflops\": %.3f", sums[0] / n);
    for (std::size_t i = 1; i < dtypes.size(); ++i) {
      std::printf(", \"gflops_%.*s\": %.3f",
                  static_cast<int>(meshtrain::to_string(dtypes[i]).size()),
                  meshtrain::to_string(dtypes[i]).data(), sums[i] / n);
    }
    std::printf("}\n");
  }
  return 0;
}
