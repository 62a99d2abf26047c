// bench/grouped_gemm_bench.cpp
//
// The MoE experts' grouped GEMM against the dense GEMM of the same FLOPs (issue 14's benchmark;
// a command, not a test). configs/llama_moe.toml's shapes by default: a micro-batch of
// N = 768 tokens, top-2 of E = 8 experts, C = 128, expert F = 176; the dense model's MLP
// input GEMM [N, C]·[C, 2F] has the same FLOPs as the experts' [N·k rows, C]·[C, F] in total.
// Timed (GFLOP/s of kernels::gemm, the forward y = x·Wᵀ shape), side by side in one run:
//   dense        one [N, C]·[C, 2F] GEMM (the dense MLP's up projection)
//   dense_rows   one [N·k, C]·[C, F] GEMM (all expert rows as one matrix)
//   grouped_even E GEMMs of N·k/E rows each (a balanced router)
//   grouped_warm E GEMMs of a fixed uneven split (the same split every call: oneDNN's
//                primitives for its shapes are cached after the first call)
//   grouped_cold E GEMMs of a new uneven split every call: new row counts mean new oneDNN
//                primitives (kernels/cpu/gemm.cpp caches one per shape), which is what a
//                training run's first steps pay until the counts it meets are cached
//
//   grouped_gemm_bench [--tokens N] [--experts E] [--top-k K] [--embd C] [--ffn F]
//
// 1 thread (the caller's), wall time, the median of 3 windows of ≥ 0.3 s after a warm-up.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/kernels/kernels.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  std::int64_t tokens = 768, experts = 8, top_k = 2, embd = 128, ffn = 176;
};

// A split of `rows` into `parts` positive counts: Philox-free, a fixed LCG from `seed`.
std::vector<std::int64_t> uneven_split(std::int64_t rows, std::int64_t parts, std::uint64_t seed) {
  std::vector<double> w(static_cast<std::size_t>(parts));
  double sum = 0.0;
  for (double& x : w) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    x = 0.25 + static_cast<double>(seed >> 40) / static_cast<double>(1ULL << 24);
    sum += x;
  }
  std::vector<std::int64_t> out;
  std::int64_t used = 0;
  for (std::size_t e = 0; e + 1 < w.size(); ++e) {
    out.push_back(std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(rows) * w[e] / sum)));
    used += out.back();
  }
  out.push_back(rows - used);
  return out;
}

// GFLOP/s of `call` (flops per call): median of 3 windows of ≥ 0.3 s.
template <typename Call>
double rate(double flops, Call&& call) {
  call();  // warm-up
  std::vector<double> windows;
  for (int w = 0; w < 3; ++w) {
    std::int64_t calls = 0;
    const auto start = Clock::now();
    double seconds = 0.0;
    do {
      call();
      ++calls;
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
    } while (seconds < 0.3);
    windows.push_back(flops * static_cast<double>(calls) / seconds * 1e-9);
  }
  std::sort(windows.begin(), windows.end());
  return windows[1];
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::int64_t v = std::atoll(argv[i + 1]);
    if (flag == "--tokens")
      s.tokens = v;
    else if (flag == "--experts")
      s.experts = v;
    else if (flag == "--top-k")
      s.top_k = v;
    else if (flag == "--embd")
      s.embd = v;
    else if (flag == "--ffn")
      s.ffn = v;
    else {
      std::fprintf(stderr, "grouped_gemm_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  meshtrain::kernels::set_num_threads(1);
  const std::int64_t C = s.embd, F = s.ffn, rows = s.tokens * s.top_k;
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(C * F);
  std::vector<float> x(static_cast<std::size_t>(rows * C), 0.01f);
  std::vector<float> w(static_cast<std::size_t>(s.experts * F * C), 0.02f);
  std::vector<float> y(static_cast<std::size_t>(rows * std::max(F, 2 * F)), 0.0f);
  const auto grouped = [&](const std::vector<std::int64_t>& counts) {
    std::int64_t at = 0;
    for (std::size_t e = 0; e < counts.size(); ++e) {
      meshtrain::kernels::gemm(x.data() + at * C, w.data() + e * F * C, y.data() + at * F,
                               counts[e], F, C, false, true, 1.0f, 0.0f);
      at += counts[e];
    }
  };
  const std::vector<std::int64_t> even(static_cast<std::size_t>(s.experts), rows / s.experts);
  const std::vector<std::int64_t> fixed = uneven_split(rows, s.experts, 7);
  std::uint64_t seed = 11;
  std::printf("N=%lld tokens, E=%lld, top_k=%lld, C=%lld, F=%lld: %.3g FLOPs per call, 1 thread\n",
              static_cast<long long>(s.tokens), static_cast<long long>(s.experts),
              static_cast<long long>(s.top_k), static_cast<long long>(C), static_cast<long long>(F),
              flops);
  const double dense = rate(flops, [&] {
    meshtrain::kernels::gemm(x.data(), w.data(), y.data(), s.tokens, s.top_k * F, C, false, true,
                             1.0f, 0.0f);
  });
  const double dense_rows = rate(flops, [&] {
    meshtrain::kernels::gemm(x.data(), w.data(), y.data(), rows, F, C, false, true, 1.0f, 0.0f);
  });
  const double even_rate = rate(flops, [&] { grouped(even); });
  const double warm = rate(flops, [&] { grouped(fixed); });
  const double cold = rate(flops, [&] { grouped(uneven_split(rows, s.experts, ++seed)); });
  const auto line = [&](const char* name, double g) {
    std::printf("%-13s %8.1f GFLOP/s  %5.2fx dense\n", name, g, g / dense);
  };
  line("dense", dense);
  line("dense_rows", dense_rows);
  line("grouped_even", even_rate);
  line("grouped_warm", warm);
  line("grouped_cold", cold);
  return 0;
}
