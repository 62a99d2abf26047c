// bench/gemm_bench.cpp
//
// GFLOP/s of meshtrain::kernels::gemm (oneDNN matmul) on the GEMMs of meshtrain's training steps.
//
//   gemm_bench [threads] [--json] [--dtypes f32,bf16,f16] [--cpu-time] [--cold]
//              [--model L,C,F,V,TOKENS[,T,H] | --model 6l384] [--windows N] [--min-seconds S]
//
// Default mode: for every linear layer of the main GPT job (x [tokens, in] · Wᵀ, W [out, in]) the
// forward y = x·Wᵀ and the two backward GEMMs dx = dy·W and dW += dyᵀ·x, at 768 and 384 tokens per
// rank (C = 128: qkv 128→384, attention proj 128→128, MLP 128→512 and 512→128, lm_head 128→65).
// Each GEMM is timed with f32 operands (kernels::gemm) and with the bf16 and f16 operands of mixed
// precision (kernels::gemm_16bit: f32 accumulation and output; f16 runs as widened f32 with
// Debian's oneDNN 2.6, which has no f16 CPU matmul), side by side. Prints one line per GEMM and
// the mean of the medians per dtype; with --json, stdout carries only {"gflops": f32 mean,
// "gflops_bf16": …, "gflops_f16": …} (per-GEMM lines go to stderr).
//
// --model L,C,F,V,TOKENS: every GEMM of one training step of a GPT-2 model with L blocks, width
// C, MLP hidden F, vocabulary V and TOKENS tokens per step (micro-batch × block), with the shapes
// and transposes the trainer uses (fused c_attn C→3C, attn c_proj C→C, c_fc C→F, mlp c_proj
// F→C per block, lm_head C→V; each forward, backward-data and backward-weight, dx included for
// the first block since the embedding needs it). With T,H (sequence length and heads) the
// attention core's matrix products are timed too, per head on oneDNN as a GEMM-bound
// implementation would run them (head_dim D = C/H; per block and head S = Q·Kᵀ and dP = dO·Vᵀ
// [T, T, D], O = P·V, dV = Pᵀ·dO, dQ = dS·K and dK = dSᵀ·Q [T, D, T]; TOKENS/T sequences) and
// counted at their causal half: the FLOPs a causal step needs, half of what a dense T × T
// product computes (meshtrain runs them in the tiled attention kernel, which skips the masked
// half). `6l384` is 6,384,1536,65,1024,256,6 (GPT-2 6L/384, T 256 × micro-batch 4, 6 heads, the
// character vocabulary). Prints, per dtype, the GEMM FLOPs of the step, the seconds the step's
// GEMMs take at the measured rates (Σ count × seconds per call) and the resulting GFLOP/s, for
// the linear layers and for the attention products; with --json stdout carries only
// {"model": …, "flops_per_step": …, "seconds_per_step": f32, "gflops": f32,
// "seconds_per_step_bf16": …, "gflops_bf16": …} for the linear layers and, with T,H,
// "attention_flops_per_step" and "attention_seconds_per_step[_bf16]". Any dtype subset may be
// measured in this mode.
//
// --dtypes: comma-separated whole names out of f32, bf16, f16 (anything else exits 2); the
// default mode needs f32 (the reference of its ratios). --windows N (default 3) timed windows of
// at least --min-seconds S (default 0.3) each, after a warm-up; the median is reported (on a
// shared 2-core machine a burst of someone else's work can halve one window). --cpu-time (1
// thread only) times by the thread's CPU clock instead of the wall clock. --cold evicts the
// private caches before every call (writes a 16 MiB buffer, 4 × this machine's 2 MiB L2 per
// core, untimed) and times each call alone: the operands then come from L3 or memory, as in a
// training step, where the layers between two GEMMs have displaced them (issue 16 item 2: how
// much of the step's gap to the hot-cache GEMM-bound time is cache). Both modes print the
// CPU model and the ISA oneDNN dispatches (dnnl::get_effective_cpu_isa) first.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/core/half.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/kernels.h"

namespace {

using meshtrain::DType;

struct Layer {
  std::string name;
  std::int64_t in;
  std::int64_t out;
  std::int64_t count;  // how many such layers one step runs
};

struct Gemm {
  std::string label;
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  float beta;
  std::int64_t count;  // calls per step (model mode)
  double share = 1.0;  // the part of its FLOPs a step needs (the causal half of attention's)
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }
};

struct Options {
  int threads = 1;
  bool json = false;
  std::vector<DType> dtypes{DType::f32, DType::bf16, DType::f16};
  std::optional<std::vector<std::int64_t>> model;  // L, C, F, V, TOKENS[, T, H]
  std::string model_text;
  int windows = 3;
  double min_seconds = 0.3;
};

// --cpu-time: this thread's CPU seconds instead of wall seconds. With 1 thread every GEMM runs
// on the calling thread, so the time other processes take the core from it does not count: a
// usable figure on a shared machine (the caches are still shared).
bool g_cpu_time = false;
bool g_cold = false;  // --cold: the private caches evicted before every timed call

/// Writes 16 MiB (untimed by the callers): what a call reads afterwards comes from L3 or memory.
void evict_caches() {
  static std::vector<std::uint64_t> junk(std::size_t{16} << 17);  // 16 MiB
  static std::uint64_t round = 0;
  ++round;
  for (std::uint64_t& x : junk) x += round;
}

double now_s() {
  if (g_cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double seconds_since(double start) { return now_s() - start; }

/// GFLOP/s of one timed window of at least min_seconds (after a warm-up).
double measure_gflops(const Gemm& g, DType dtype, double min_seconds) {
  const auto size = [](std::int64_t rows, std::int64_t cols) {
    return static_cast<std::size_t>(rows * cols);
  };
  std::vector<float> a(size(g.m, g.k)), b(size(g.k, g.n)), c(size(g.m, g.n), 0.0f);
  meshtrain::fill_normal(a, 1, 1, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(b, 1, 2, 0, 0.0f, 1.0f);
  std::vector<std::uint16_t> a16(a.size()), b16(b.size());
  if (dtype != DType::f32) {
    meshtrain::cast_f32_to_16bit(a.data(), a16.data(), static_cast<std::int64_t>(a.size()), dtype);
    meshtrain::cast_f32_to_16bit(b.data(), b16.data(), static_cast<std::int64_t>(b.size()), dtype);
  }
  const auto call = [&] {
    if (dtype == DType::f32) {
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

  if (g_cold) {  // each call timed alone after an untimed eviction
    double timed = 0.0;
    std::int64_t calls = 0;
    while (timed < min_seconds || calls < 3) {
      evict_caches();
      const double start = now_s();
      call();
      timed += seconds_since(start);
      ++calls;
    }
    return g.flops() * static_cast<double>(calls) / timed * 1e-9;
  }
  // Timed: doubling batches until one lasts ≥ min_seconds, so the clock is read rarely.
  std::int64_t iters = 1;
  for (;;) {
    const double start = now_s();
    for (std::int64_t i = 0; i < iters; ++i) call();
    const double elapsed = seconds_since(start);
    if (elapsed >= min_seconds) return g.flops() * static_cast<double>(iters) / elapsed * 1e-9;
    iters *= 2;
  }
}

/// Median GFLOP/s of `windows` timed windows: on the 2-core machines a burst of someone else's
/// work (a compile, a test) can halve one window, and with 2 OpenMP threads a busy core stalls
/// the other thread at every barrier; the median ignores such windows.
double measure(const Gemm& g, DType dtype, const Options& o) {
  std::vector<double> runs(static_cast<std::size_t>(o.windows));
  for (double& r : runs) r = measure_gflops(g, dtype, o.min_seconds);
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

std::string name_of(DType d) { return std::string(meshtrain::to_string(d)); }

/// The three GEMMs of each linear layer, shapes and transposes exactly as linear_forward /
/// linear_backward call gemm.
void add_linear(std::vector<Gemm>& out, const Layer& l, std::int64_t tokens,
                const std::string& tag) {
  out.push_back({"fwd y=x*W^T     " + tag, tokens, l.out, l.in, false, true, 0.0f, l.count});
  out.push_back({"bwd dx=dy*W     " + tag, tokens, l.in, l.out, false, false, 0.0f, l.count});
  out.push_back({"bwd dW+=dy^T*x  " + tag, l.out, l.in, tokens, true, false, 1.0f, l.count});
}

std::vector<Gemm> default_gemms() {
  const Layer layers[] = {
      {"attn.qkv", 128, 384, 1}, {"attn.proj", 128, 128, 1}, {"mlp.fc", 128, 512, 1},
      {"mlp.proj", 512, 128, 1}, {"lm_head", 128, 65, 1},
  };
  std::vector<Gemm> gemms;
  for (const std::int64_t tokens : {768, 384}) {
    for (const Layer& l : layers) {
      add_linear(gemms, l, tokens, l.name + " tokens=" + std::to_string(tokens));
    }
  }
  return gemms;
}

/// One training step of GPT-2 (L blocks of fused c_attn, c_proj, c_fc, mlp c_proj; lm_head).
std::vector<Gemm> model_gemms(const std::vector<std::int64_t>& m) {
  const std::int64_t L = m[0], C = m[1], F = m[2], V = m[3], tokens = m[4];
  const Layer layers[] = {
      {"attn.c_attn", C, 3 * C, L}, {"attn.c_proj", C, C, L}, {"mlp.c_fc", C, F, L},
      {"mlp.c_proj", F, C, L},      {"lm_head", C, V, 1},
  };
  std::vector<Gemm> gemms;
  for (const Layer& l : layers)
    add_linear(gemms, l, tokens, l.name + " ×" + std::to_string(l.count));
  return gemms;
}

/// The attention core's products of one step, per head (empty without T,H): each counted
/// L · (TOKENS/T sequences) · H times at share 0.5, the causal half.
std::vector<Gemm> attention_gemms(const std::vector<std::int64_t>& m) {
  if (m.size() < 7) return {};
  const std::int64_t L = m[0], C = m[1], tokens = m[4], T = m[5], H = m[6], D = C / H;
  const std::int64_t count = L * (tokens / T) * H;
  const std::string tag = " ×" + std::to_string(count);
  return {{"attn fwd S=Q*K^T" + tag, T, T, D, false, true, 0.0f, count, 0.5},
          {"attn fwd O=P*V  " + tag, T, D, T, false, false, 0.0f, count, 0.5},
          {"attn bwd dP=dO*V^T" + tag, T, T, D, false, true, 0.0f, count, 0.5},
          {"attn bwd dV=P^T*dO" + tag, T, D, T, true, false, 0.0f, count, 0.5},
          {"attn bwd dQ=dS*K" + tag, T, D, T, false, false, 0.0f, count, 0.5},
          {"attn bwd dK=dS^T*Q" + tag, T, D, T, true, false, 0.0f, count, 0.5}};
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "all (no limit reported)";
  }
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [threads ≥ 1] [--json] [--dtypes f32,bf16,f16] [--cpu-time] [--cold]\n"
               "          [--model L,C,F,V,TOKENS | --model 6l384] [--windows N ≥ 1]"
               " [--min-seconds S > 0]\n",
               argv0);
  return 2;
}

/// Whole names, comma-separated; nullopt for an unknown or repeated name.
std::optional<std::vector<DType>> parse_dtypes(const std::string& list) {
  std::vector<DType> out;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    std::optional<DType> d;
    for (const DType c : {DType::f32, DType::bf16, DType::f16}) {
      if (item == name_of(c)) d = c;
    }
    if (!d || std::find(out.begin(), out.end(), *d) != out.end()) return std::nullopt;
    out.push_back(*d);
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end(),
            [](DType a, DType b) { return static_cast<int>(a) < static_cast<int>(b); });
  return out;
}

/// Operand bytes (f32 A, B and C) of the largest GEMM: `--model` refuses a model whose GEMMs
/// would not fit before allocating anything (a huge width threw std::bad_alloc).
double largest_gemm_bytes(const std::vector<Gemm>& gemms) {
  double most = 0.0;
  for (const Gemm& g : gemms) {
    const double m = static_cast<double>(g.m), n = static_cast<double>(g.n),
                 k = static_cast<double>(g.k);
    most = std::max(most, 4.0 * (m * k + k * n + m * n));
  }
  return most;
}
constexpr double kMaxGemmBytes = 4.0 * 1073741824.0;

double largest_gemm_flops(const std::vector<Gemm>& gemms) {
  double most = 0.0;
  for (const Gemm& g : gemms) most = std::max(most, g.flops());
  return most;
}
constexpr double kMaxGemmFlops = 1e12;

/// A bad option value: names the option, the value and the rule; exit status 2.
int bad_value(const char* option, const char* value, const char* rule) {
  std::fprintf(stderr, "gemm_bench: %s %s: expected %s\n", option, value, rule);
  return 2;
}

/// The linear layers' and the attention core's GEMMs (the size limits apply to both).
std::vector<Gemm> all_model_gemms(const std::vector<std::int64_t>& m) {
  std::vector<Gemm> all = model_gemms(m);
  for (Gemm& g : attention_gemms(m)) all.push_back(std::move(g));
  return all;
}

/// "6l384" or five positive integers L,C,F,V,TOKENS, or seven with T,H: T divides TOKENS, H
/// divides C.
std::optional<std::vector<std::int64_t>> parse_model(const std::string& text) {
  if (text == "6l384") return std::vector<std::int64_t>{6, 384, 1536, 65, 1024, 256, 6};
  std::vector<std::int64_t> out;
  const char* p = text.c_str();
  for (;;) {
    char* end = nullptr;
    const long long v = std::strtoll(p, &end, 10);
    if (end == p || v < 1 || v > (1LL << 20)) return std::nullopt;
    out.push_back(v);
    if (*end == '\0') break;
    if (*end != ',') return std::nullopt;
    p = end + 1;
  }
  if (out.size() != 5 && out.size() != 7) return std::nullopt;
  if (out.size() == 7 && (out[4] % out[5] != 0 || out[1] % out[6] != 0)) return std::nullopt;
  return out;
}

/// Parses argv; returns an exit status (2) on a bad argument.
std::optional<int> parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--json") {
      o.json = true;
    } else if (arg == "--cpu-time") {
      g_cpu_time = true;
    } else if (arg == "--cold") {
      g_cold = true;
    } else if (arg == "--dtypes" && has_value) {
      const auto d = parse_dtypes(argv[++i]);
      if (!d) {
        std::fprintf(
            stderr,
            "gemm_bench: --dtypes %s: expected comma-separated names out of f32, bf16, f16\n",
            argv[i]);
        return 2;
      }
      o.dtypes = *d;
    } else if (arg == "--model" && has_value) {
      o.model_text = argv[++i];
      o.model = parse_model(o.model_text);
      if (!o.model) {
        std::fprintf(
            stderr,
            "gemm_bench: --model %s: expected L,C,F,V,TOKENS or L,C,F,V,TOKENS,T,H (positive "
            "integers ≤ 2^20; T divides TOKENS, H divides C) or 6l384\n",
            argv[i]);
        return 2;
      }
      if (const auto bytes = largest_gemm_bytes(all_model_gemms(*o.model)); bytes > kMaxGemmBytes) {
        std::fprintf(
            stderr,
            "gemm_bench: --model %s: its largest GEMM needs %.1f GiB of operands (f32 A, B, C), "
            "above the %.0f GiB this bench allows; fix: smaller C, F, TOKENS or T\n",
            argv[i], bytes / 1073741824.0, kMaxGemmBytes / 1073741824.0);
        return 2;
      }
      if (const double f = largest_gemm_flops(all_model_gemms(*o.model)); f > kMaxGemmFlops) {
        std::fprintf(stderr,
                     "gemm_bench: --model %s: its largest GEMM is %.2g FLOP, above the %.0g this "
                     "bench times "
                     "(one call would take many seconds, a window minutes); fix: smaller C, F or "
                     "TOKENS\n",
                     argv[i], f, kMaxGemmFlops);
        return 2;
      }
    } else if (arg == "--windows" && has_value) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || v < 1 || v > 1000)
        return bad_value("--windows", argv[i], "an integer from 1 to 1000");
      o.windows = static_cast<int>(v);
    } else if (arg == "--min-seconds" && has_value) {
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(v > 0.0) || v > 600.0)
        return bad_value("--min-seconds", argv[i], "a number of seconds > 0 and ≤ 600");
      o.min_seconds = v;
    } else {
      char* end = nullptr;
      const long value = std::strtol(argv[i], &end, 10);
      if (end == argv[i] || *end != '\0' || value < 1 || value > 1024) {
        if (argv[i][0] == '-') {
          std::fprintf(stderr, "gemm_bench: unknown option or missing value: %s\n", argv[i]);
          return usage(argv[0]);
        }
        return bad_value("threads", argv[i], "an integer from 1 to 1024");
      }
      o.threads = static_cast<int>(value);
    }
  }
  if (!o.model && o.dtypes.front() != DType::f32) {
    std::fprintf(stderr, "--dtypes must include f32 (the reference of the ratios)\n");
    return 2;
  }
  if (g_cpu_time && o.threads != 1) {
    std::fprintf(stderr, "--cpu-time needs 1 thread (it reads the calling thread's clock)\n");
    return 2;
  }
  return std::nullopt;
}

void print_header(FILE* lines, const Options& o) {
  std::fprintf(lines, "cpu: %s; oneDNN effective ISA: %s\n", cpu_model().c_str(),
               isa_name(dnnl::get_effective_cpu_isa()));
  std::fprintf(lines,
               "gemm_bench: %d thread(s); GFLOP/s per GEMM, the median of %d windows of "
               "≥ %.2f s (%s%s)\n",
               o.threads, o.windows, o.min_seconds, g_cpu_time ? "thread CPU time" : "wall clock",
               g_cold ? "; caches evicted before every call, which is timed alone" : "");
}

/// Default mode: per-GEMM GFLOP/s, ratios to f32, means.
void run_default(const Options& o) {
  const std::vector<Gemm> gemms = default_gemms();
  FILE* lines = o.json ? stderr : stdout;
  std::fprintf(lines, "%-40s %-18s", "GEMM", "shape");
  for (const DType d : o.dtypes) {
    std::fprintf(lines, " %8s%s", name_of(d).c_str(), d == DType::f32 ? "" : " (× f32)");
  }
  std::fprintf(lines, "\n");
  std::vector<double> sums(o.dtypes.size(), 0.0);
  for (const Gemm& g : gemms) {
    std::fprintf(lines, "%-40s M=%-4lld N=%-4lld K=%-4lld", g.label.c_str(),
                 static_cast<long long>(g.m), static_cast<long long>(g.n),
                 static_cast<long long>(g.k));
    double f32 = 0.0;
    for (std::size_t i = 0; i < o.dtypes.size(); ++i) {
      const double r = measure(g, o.dtypes[i], o);
      sums[i] += r;
      if (i == 0) {
        f32 = r;
        std::fprintf(lines, " %8.1f", r);
      } else {
        std::fprintf(lines, " %8.1f (%.2f×)", r, r / f32);
      }
    }
    std::fprintf(lines, "\n");
  }
  const auto n = static_cast<double>(gemms.size());
  std::fprintf(lines, "mean over %zu GEMMs:", gemms.size());
  for (std::size_t i = 0; i < o.dtypes.size(); ++i) {
    std::fprintf(lines, "  %s %.1f GFLOP/s", name_of(o.dtypes[i]).c_str(), sums[i] / n);
    if (i > 0) std::fprintf(lines, " (%.2f×)", sums[i] / sums[0]);
  }
  std::fprintf(lines, "\n");
  if (o.json) {
    std::printf("{\"gflops\": %.3f", sums[0] / n);
    for (std::size_t i = 1; i < o.dtypes.size(); ++i) {
      std::printf(", \"gflops_%s\": %.3f", name_of(o.dtypes[i]).c_str(), sums[i] / n);
    }
    std::printf("}\n");
  }
}

/// Model mode: the GEMM-bound time of one training step per dtype.
/// Seconds per step of `gemms` per dtype at the measured rates (Σ share · count · FLOPs ÷ rate),
/// one line per GEMM on `lines`.
std::vector<double> time_gemms(const std::vector<Gemm>& gemms, const Options& o, FILE* lines) {
  std::vector<double> seconds(o.dtypes.size(), 0.0);
  for (const Gemm& g : gemms) {
    std::fprintf(lines, "%-34s M=%-5lld N=%-5lld K=%-5lld", g.label.c_str(),
                 static_cast<long long>(g.m), static_cast<long long>(g.n),
                 static_cast<long long>(g.k));
    for (std::size_t i = 0; i < o.dtypes.size(); ++i) {
      const double r = measure(g, o.dtypes[i], o);
      seconds[i] += g.share * g.flops() * static_cast<double>(g.count) / (r * 1e9);
      std::fprintf(lines, "  %s %7.1f GFLOP/s", name_of(o.dtypes[i]).c_str(), r);
    }
    std::fprintf(lines, "\n");
  }
  return seconds;
}

double step_flops(const std::vector<Gemm>& gemms) {
  double flops = 0.0;
  for (const Gemm& g : gemms) flops += g.share * g.flops() * static_cast<double>(g.count);
  return flops;
}

void run_model(const Options& o) {
  const std::vector<Gemm> gemms = model_gemms(*o.model), attention = attention_gemms(*o.model);
  FILE* lines = o.json ? stderr : stdout;
  const double flops = step_flops(gemms), attention_flops = step_flops(attention);
  std::fprintf(lines, "model %s: %zu GEMM shapes, %.3f GFLOP per training step\n",
               o.model_text.c_str(), gemms.size(), flops * 1e-9);
  const std::vector<double> seconds = time_gemms(gemms, o, lines);
  if (!attention.empty()) {
    std::fprintf(lines,
                 "attention core: %zu GEMM shapes per head, %.3f GFLOP per step (causal half)\n",
                 attention.size(), attention_flops * 1e-9);
  }
  const std::vector<double> attention_seconds = time_gemms(attention, o, lines);
  for (std::size_t i = 0; i < o.dtypes.size(); ++i) {
    std::fprintf(
        lines, "step GEMMs %s: %.3f GFLOP per step, %.4f s per step, %.1f GFLOP/s (%d thread(s))\n",
        name_of(o.dtypes[i]).c_str(), flops * 1e-9, seconds[i], flops * 1e-9 / seconds[i],
        o.threads);
    if (!attention.empty()) {
      std::fprintf(lines,
                   "attention GEMMs %s: %.3f GFLOP per step, %.4f s per step, %.1f GFLOP/s\n",
                   name_of(o.dtypes[i]).c_str(), attention_flops * 1e-9, attention_seconds[i],
                   attention_flops * 1e-9 / attention_seconds[i]);
    }
  }
  if (o.json) {
    std::printf("{\"model\": \"%s\", \"threads\": %d, \"flops_per_step\": %.0f",
                o.model_text.c_str(), o.threads, flops);
    if (!attention.empty()) std::printf(", \"attention_flops_per_step\": %.0f", attention_flops);
    for (std::size_t i = 0; i < o.dtypes.size(); ++i) {
      const std::string suffix = o.dtypes[i] == DType::f32 ? "" : "_" + name_of(o.dtypes[i]);
      std::printf(", \"seconds_per_step%s\": %.6f, \"gflops%s\": %.3f", suffix.c_str(), seconds[i],
                  suffix.c_str(), flops * 1e-9 / seconds[i]);
      if (!attention.empty()) {
        std::printf(", \"attention_seconds_per_step%s\": %.6f", suffix.c_str(),
                    attention_seconds[i]);
      }
    }
    std::printf("}\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto status = parse(argc, argv, o)) return *status;
  meshtrain::kernels::set_num_threads(o.threads);
  print_header(o.json ? stderr : stdout, o);
  if (o.model) {
    run_model(o);
  } else {
    run_default(o);
  }
  return 0;
}
