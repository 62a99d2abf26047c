// bench/attention_bench.cpp
//
// The tiled FlashAttention-2 chunk kernel (attention_chunk_forward, attention_delta +
// attention_chunk_backward, kernels/cpu/flash_*.cpp) on full causal sequences (batch 1 by
// default), GPT-2's fused [q | k | v] rows, the 6-layer/384 model's heads (6 × head_dim 64) by
// default (nanoGPT's CPU config: --batch 12 --heads 4 --head-dim 32 --t 64),
// against oneDNN's GEMM on the same shapes in the same run, f32 and bf16 tile operands.
//
//   attention_bench [threads] [--heads H] [--head-dim D] [--batch B] [--t T ...] [--rounds R]
//                   [--no-bf16]
//                   [--bf16-portable] [--bf16-dot] [--no-f32] [--old] [--cpu-time]
//
// GFLOP/s convention: causal forward = 2 GEMMs (S = q·kᵀ, O = P·v) over half the T×T scores,
// 2·2·(T²/2)·d = 2·T²·d FLOPs per head; backward 2.5× that (5 GEMMs; attention_delta counted
// in its time), forward+backward 3.5× (FlashAttention-2 §4.1's convention), whatever a kernel
// recomputes. "gemm" is kernels::gemm (oneDNN f32; for the bf16 rows kernels::gemm_16bit, oneDNN
// bf16 with f32 sums) on the forward's two products as whole GEMMs, [T, d]·[d, T] (scores,
// B transposed) then [T, T]·[T, d], rated by their FLOPs over their summed time: the rate the
// tiles would reach as big GEMMs. "x gemm" is a kernel's rate over that. Each round measures
// every figure of a T side by side (gemm, fwd, bwd, fwd+bwd; best of 2 windows of ≥ 0.2 s,
// ≥ 1 call, after a warm-up call); the table prints each figure's median over the rounds.
// bf16 rows run the path bf16 selects (AMX TDPBF16PS where the build and the CPU have it, else
// AVX512_BF16 VDPBF16PS where built; --bf16-portable: the bf16-rounded operands through the
// f32 micro-kernel); --bf16-dot adds a "bf16 dot" row (VDPBF16PS) beside it, --no-f32 drops
// the f32 row (for profiling one path). --old adds the row-at-a-time kernel
// (gqa_attention_forward/backward) as an f32 row "old" (slow above T = 2048).
// A bad argument exits 2 with a line naming it, as does a T whose run would need more than
// 4 GiB or 1e13 FLOP per round (tests/e2e/attention_bench_args.sh).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/core/half.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/cpu/flash_operands.h"
#include "meshtrain/kernels/kernels.h"

namespace {

using meshtrain::kernels::AttentionChunkDims;
using meshtrain::kernels::AttentionMask;
using meshtrain::kernels::cpu::flash::TilePath;

bool g_cpu_time = false;

double now_s() {
  if (g_cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Best seconds per call of `call` over 2 windows of ≥ 0.2 s each (at least one call each).
double seconds_per_call(const std::function<void()>& call) {
  call();  // warm-up: pages, caches, oneDNN primitive
  double best = 1e300;
  for (int w = 0; w < 2; ++w) {
    std::int64_t calls = 0;
    const double start = now_s();
    double elapsed = 0.0;
    do {
      call();
      ++calls;
      elapsed = now_s() - start;
    } while (elapsed < 0.2);
    best = std::min(best, elapsed / static_cast<double>(calls));
  }
  return best;
}

struct Rates {
  double gemm, fwd, bwd, fwd_bwd;  // GFLOP/s
};

enum class Kernel : std::uint8_t { old_rows, tiled };

/// One round of a kernel on one causal sequence of T tokens with `heads` heads of `hd`, the
/// tiled one on tile path `path`.
Rates time_attention(Kernel kernel, std::int64_t B, std::int64_t T, std::int64_t heads,
                     std::int64_t hd, TilePath path) {
  namespace k = meshtrain::kernels;
  const std::int64_t C = heads * hd;
  std::vector<float> qkv(static_cast<std::size_t>(B * T * 3 * C)),
      dout(static_cast<std::size_t>(B * T * C));
  meshtrain::fill_normal(qkv, 1, 1, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(dout, 1, 2, 0, 0.0f, 1.0f);
  std::vector<float> out(dout.size()), lse(static_cast<std::size_t>(B * heads * T)),
      delta(lse.size());
  std::vector<float> dqkv(qkv.size(), 0.0f);
  const k::QkvRows in{qkv.data(), qkv.data() + C, qkv.data() + 2 * C, 3 * C, 3 * C};
  const k::QkvGradRows grad{dqkv.data(), dqkv.data() + C, dqkv.data() + 2 * C, 3 * C, 3 * C};
  const k::GqaDims gd{B, T, heads, heads, hd};
  const AttentionChunkDims cd{B, T, T, heads, heads, hd, 0, 0, T, T, T};
  const bool tiled = kernel == Kernel::tiled;
  const auto forward = [&] {
    if (tiled) {
      k::cpu::flash::chunk_forward(path, in, cd, AttentionMask::causal, out.data(), C, lse.data());
    } else {
      k::gqa_attention_forward(in, out.data(), lse.data(), gd);
    }
  };
  const auto backward = [&] {
    if (tiled) {
      k::attention_delta(out.data(), dout.data(), C, cd, delta.data());
      k::cpu::flash::chunk_backward(path, in, dout.data(), C, lse.data(), delta.data(), grad, cd,
                                    AttentionMask::causal);
    } else {
      k::gqa_attention_backward(in, out.data(), lse.data(), dout.data(), grad, gd);
    }
  };
  const double flops = 2.0 * static_cast<double>(T) * static_cast<double>(T) *
                       static_cast<double>(hd) * static_cast<double>(heads) *
                       static_cast<double>(B);
  Rates r{};
  r.fwd = flops / seconds_per_call(forward) * 1e-9;
  r.bwd = 2.5 * flops / seconds_per_call(backward) * 1e-9;
  r.fwd_bwd = 3.5 * flops / seconds_per_call([&] {
                forward();
                backward();
              }) *
              1e-9;
  return r;
}

/// The forward's two products as whole GEMMs (f32, or bf16 operands with f32 sums).
double gemm_gflops(std::int64_t T, std::int64_t hd, bool bf16) {
  namespace k = meshtrain::kernels;
  const auto n = static_cast<std::size_t>(T * hd);
  std::vector<float> q(n), kk(n), v(n), s(static_cast<std::size_t>(T * T)), o(n);
  meshtrain::fill_normal(q, 1, 3, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(kk, 1, 4, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(v, 1, 5, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(s, 1, 6, 0, 0.0f, 0.1f);
  const auto half = [](const std::vector<float>& x) {
    std::vector<std::uint16_t> h(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) h[i] = meshtrain::f32_to_bf16(x[i]);
    return h;
  };
  const std::vector<std::uint16_t> qh = half(q), kh = half(kk), vh = half(v), sh = half(s);
  const double sec = seconds_per_call([&] {
    if (bf16) {
      k::gemm_16bit(qh.data(), kh.data(), s.data(), T, T, hd, false, true, 1.0f, 0.0f,
                    meshtrain::DType::bf16);
      k::gemm_16bit(sh.data(), vh.data(), o.data(), T, hd, T, false, false, 1.0f, 0.0f,
                    meshtrain::DType::bf16);
    } else {
      k::gemm(q.data(), kk.data(), s.data(), T, T, hd, false, true, 1.0f, 0.0f);
      k::gemm(s.data(), v.data(), o.data(), T, hd, T, false, false, 1.0f, 0.0f);
    }
  });
  return 4.0 * static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(hd) / sec *
         1e-9;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t m = x.size() / 2;
  return x.size() % 2 != 0 ? x[m] : 0.5 * (x[m - 1] + x[m]);
}

struct Row {
  const char* name;
  Kernel kernel;
  TilePath path;
  bool bf16_gemm;
};

void print_row(const Row& row, std::int64_t T, const std::vector<Rates>& rounds) {
  std::vector<double> g, f, b, fb;
  for (const Rates& r : rounds) {
    g.push_back(r.gemm);
    f.push_back(r.fwd);
    b.push_back(r.bwd);
    fb.push_back(r.fwd_bwd);
  }
  const double gm = median(g), fm = median(f), bm = median(b), fbm = median(fb);
  std::printf("%6lld | %-8s | %8.1f | %8.1f %8.1f %8.1f | %6.2fx %6.2fx %6.2fx | %8.1f-%-8.1f\n",
              static_cast<long long>(T), row.name, gm, fm, bm, fbm, fm / gm, bm / gm, fbm / gm,
              *std::min_element(fb.begin(), fb.end()), *std::max_element(fb.begin(), fb.end()));
  std::fflush(stdout);
}

struct Options {
  int threads = 1, rounds = 3;
  bool bf16 = true, old = false, f32 = true, dot_row = false;
  TilePath bf16_path = meshtrain::kernels::cpu::flash::tile_path(meshtrain::DType::bf16);
  std::int64_t heads = 6, hd = 64, batch = 1;
  std::vector<std::int64_t> lengths;
};

// A run's largest working set and work, refused above these (as gemm_bench does): a typo such
// as --t 100000000 is an error, not an allocation failure or an hour-long round.
constexpr double kMaxBytes = 4.0 * 1073741824.0;
constexpr double kMaxFlopsPerRound = 1e13;

int usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s [threads] [--heads H] [--head-dim D] [--batch B] [--t T ...] [--rounds R] "
      "[--no-bf16] [--bf16-portable] [--bf16-dot (AVX512_BF16 builds)] [--no-f32] [--old] "
      "[--cpu-time (1 thread)]\n",
      argv0);
  return 2;
}

/// text as an integer in [lo, hi], the whole of it; else prints which option and rule.
bool parse_int(const char* option, const char* text, std::int64_t lo, std::int64_t hi,
               std::int64_t& out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < lo || v > hi) {
    std::fprintf(stderr, "attention_bench: %s %s: expected an integer from %lld to %lld\n", option,
                 text, static_cast<long long>(lo), static_cast<long long>(hi));
    return false;
  }
  out = v;
  return true;
}

/// Parses argv into o; returns an exit status (2) on a bad argument.
std::optional<int> parse(int argc, char** argv, Options& o) {
  constexpr std::int64_t kMaxDim = 1 << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    std::int64_t v = 0;
    const auto value = [&](std::int64_t lo, std::int64_t hi) {
      return parse_int(arg.c_str(), argv[++i], lo, hi, v);
    };
    if (arg == "--cpu-time") {
      g_cpu_time = true;
    } else if (arg == "--bf16-portable") {
      o.bf16_path = TilePath::bf16_rounded;
    } else if (arg == "--no-bf16") {
      o.bf16 = false;
    } else if (arg == "--no-f32") {
      o.f32 = false;
    } else if (arg == "--bf16-dot") {
      o.dot_row = true;
    } else if (arg == "--old") {
      o.old = true;
    } else if (arg == "--heads" && has_value) {
      if (!value(1, 1024)) return 2;
      o.heads = v;
    } else if (arg == "--head-dim" && has_value) {
      if (!value(1, 1024)) return 2;
      o.hd = v;
    } else if (arg == "--batch" && has_value) {
      if (!value(1, kMaxDim)) return 2;
      o.batch = v;
    } else if (arg == "--t" && has_value) {
      if (!value(1, kMaxDim)) return 2;
      o.lengths.push_back(v);
    } else if (arg == "--rounds" && has_value) {
      if (!value(1, 1000)) return 2;
      o.rounds = static_cast<int>(v);
    } else if (arg[0] == '-') {
      std::fprintf(stderr, "attention_bench: unknown option or missing value: %s\n", argv[i]);
      return usage(argv[0]);
    } else {
      if (!parse_int("threads", argv[i], 1, 1024, v)) return 2;
      o.threads = static_cast<int>(v);
    }
  }
  if (o.lengths.empty()) o.lengths = {256, 1024, 4096};
  if (g_cpu_time && o.threads != 1) {
    std::fprintf(stderr, "attention_bench: --cpu-time times one thread; got %d threads\n",
                 o.threads);
    return 2;
  }
  if (o.dot_row && !meshtrain::kernels::cpu::flash::kHasBf16Dot) {
    std::fprintf(stderr, "attention_bench: --bf16-dot needs a build with AVX512_BF16\n");
    return 2;
  }
  for (const std::int64_t T : o.lengths) {
    // Per T: q, k, v, out, dout and their gradients ([B, T, H·d] each, 8 in all) and the
    // GEMM comparison's q, k, v, o [T, d] and scores [T, T], with bf16 copies (×1.5).
    const double b = static_cast<double>(o.batch), t = static_cast<double>(T);
    const double hd = static_cast<double>(o.hd), h = static_cast<double>(o.heads);
    const double bytes =
        4.0 * (8.0 * b * t * h * hd + 3.0 * b * h * t) + 6.0 * (4.0 * t * hd + t * t);
    const double flops = 7.0 * t * t * hd * b * h;  // fwd + bwd, causal (the header's count)
    if (bytes > kMaxBytes || flops > kMaxFlopsPerRound) {
      std::fprintf(stderr,
                   "attention_bench: --t %lld with batch %lld × %lld heads × head_dim %lld needs "
                   "%.1f GiB and %.2g FLOP per round, above the %.0f GiB and %.0g this bench "
                   "allows; fix: smaller T, batch, heads or head_dim\n",
                   static_cast<long long>(T), static_cast<long long>(o.batch),
                   static_cast<long long>(o.heads), static_cast<long long>(o.hd),
                   bytes / 1073741824.0, flops, kMaxBytes / 1073741824.0, kMaxFlopsPerRound);
      return 2;
    }
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto status = parse(argc, argv, o)) return *status;
  const int threads = o.threads, rounds = o.rounds;
  const std::int64_t heads = o.heads, hd = o.hd, batch = o.batch;
  const TilePath bf16_path = o.bf16_path;
  meshtrain::kernels::set_num_threads(threads);
  std::printf(
      "attention_bench: %d thread(s), batch %lld, %lld heads x head_dim %lld, causal, %s, median "
      "of %d rounds; GFLOP/s (fwd 2*T^2*d per head, bwd 2.5x, fwd+bwd 3.5x); bf16 path %s\n",
      threads, static_cast<long long>(batch), static_cast<long long>(heads),
      static_cast<long long>(hd), g_cpu_time ? "thread CPU time" : "wall clock", rounds,
      bf16_path == TilePath::bf16_amx   ? "amx (tdpbf16ps)"
      : bf16_path == TilePath::bf16_dot ? "avx512_bf16 dot"
                                        : "portable (rounded, f32 FMA)");
  std::printf("%6s | %-8s | %8s | %8s %8s %8s | %7s %7s %7s | %s\n", "T", "kernel", "gemm", "fwd",
              "bwd", "fwd+bwd", "fwd x", "bwd x", "f+b x", "f+b range");
  std::vector<Row> rows;
  if (o.old) rows.push_back({"old f32", Kernel::old_rows, TilePath::f32, false});
  if (o.f32) rows.push_back({"f32", Kernel::tiled, TilePath::f32, false});
  if (o.bf16) rows.push_back({"bf16", Kernel::tiled, bf16_path, true});
  if (o.dot_row) rows.push_back({"bf16 dot", Kernel::tiled, TilePath::bf16_dot, true});
  for (const std::int64_t T : o.lengths) {
    std::vector<std::vector<Rates>> results(rows.size());
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t i = 0; i < rows.size(); ++i) {
        Rates r = time_attention(rows[i].kernel, batch, T, heads, hd, rows[i].path);
        r.gemm = gemm_gflops(T, hd, rows[i].bf16_gemm);
        results[i].push_back(r);
      }
    }
    for (std::size_t i = 0; i < rows.size(); ++i) print_row(rows[i], T, results[i]);
  }
  return 0;
}
