// bench/attention_bench.cpp
//
// Causal self-attention, today's row-at-a-time kernel (gqa_attention_forward/backward) against
// the tiled FlashAttention-2 chunk kernel (attention_chunk_forward, attention_delta +
// attention_chunk_backward) on one full sequence, batch 1, GPT-2's fused [q | k | v] rows, the
// 6-layer/384 model's heads (6 × head_dim 64) by default, at T = 256 … 8192.
//
//   attention_bench [threads] [--heads H] [--max-t T] [--old-max-t T] [--new-only] [--cpu-time]
//
// GFLOP/s convention: causal forward = 2 GEMMs (S = q·kᵀ, O = P·v) over half the T×T scores,
// 2·2·(T²/2)·d = 2·T²·d FLOPs per head; forward+backward = 3.5× that (the backward's 5 GEMMs,
// i.e. 2.5× the forward, FlashAttention-2 §4.1's convention), whatever a kernel recomputes.
// Each figure is the best of 3 windows of ≥ 0.3 s (≥ 1 call), after a warm-up call. The old
// kernel takes tens of seconds per call at T = 8192, so above --old-max-t (default 2048) it
// runs one head only (its rate per head does not depend on the head count with 1 thread;
// marked *). The GEMM column is kernels::gemm (oneDNN f32) on the forward's score shape
// [T, 64]·[64, T] (T ≤ 2048; 384×384×384 once, on the header line), the rate the tiles
// would reach as one big GEMM. Scratch: bytes per thread per call, from each kernel's layout
// (old: K/V transposed for the whole sequence; new: O(block), kernels/cpu/flash_tile.h).
// The bf16 columns run the tiled kernel with bf16 tile operands (AttentionChunkDims::operands,
// kernels/cpu/flash_operands.h): the path bf16 picks (AVX512_BF16 VDPBF16PS where built), or
// with --bf16-portable the bf16-rounded operands through the f32 micro-kernel; same FLOP
// convention; "bf16 x" is their rate over the f32 tiled kernel's. --no-bf16 skips them.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <vector>

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

/// Best seconds per call of `call` over 3 windows of ≥ 0.3 s each (at least one call each).
double seconds_per_call(const std::function<void()>& call) {
  call();  // warm-up: pages, caches, oneDNN primitive
  double best = 1e300;
  for (int w = 0; w < 3; ++w) {
    std::int64_t calls = 0;
    const double start = now_s();
    double elapsed = 0.0;
    do {
      call();
      ++calls;
      elapsed = now_s() - start;
    } while (elapsed < 0.3);
    best = std::min(best, elapsed / static_cast<double>(calls));
  }
  return best;
}

struct Rates {
  double fwd, fwd_bwd;  // GFLOP/s
};

/// Old and new kernels on one causal sequence of T tokens with `heads` heads of `hd`; the new
/// one on tile path `path` (kernels/cpu/flash_operands.h).
Rates time_kernel(bool tiled, std::int64_t T, std::int64_t heads, std::int64_t hd,
                  TilePath path = TilePath::f32) {
  namespace k = meshtrain::kernels;
  const std::int64_t C = heads * hd;
  std::vector<float> qkv(static_cast<std::size_t>(T * 3 * C)),
      dout(static_cast<std::size_t>(T * C));
  meshtrain::fill_normal(qkv, 1, 1, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(dout, 1, 2, 0, 0.0f, 1.0f);
  std::vector<float> out(dout.size()), lse(static_cast<std::size_t>(heads * T)), delta(lse.size());
  std::vector<float> dqkv(qkv.size(), 0.0f);
  const k::QkvRows in{qkv.data(), qkv.data() + C, qkv.data() + 2 * C, 3 * C, 3 * C};
  const k::QkvGradRows grad{dqkv.data(), dqkv.data() + C, dqkv.data() + 2 * C, 3 * C, 3 * C};
  const k::GqaDims gd{1, T, heads, heads, hd};
  const AttentionChunkDims cd{1, T, T, heads, heads, hd, 0, 0, T, T, T};
  const auto forward = [&] {
    if (tiled) {
      k::cpu::flash::chunk_forward(path, in, cd, AttentionMask::causal, out.data(), C, lse.data());
    } else {
      k::gqa_attention_forward(in, out.data(), lse.data(), gd);
    }
  };
  const auto forward_backward = [&] {
    forward();
    if (tiled) {
      k::attention_delta(out.data(), dout.data(), C, cd, delta.data());
      k::cpu::flash::chunk_backward(path, in, dout.data(), C, lse.data(), delta.data(), grad, cd,
                                    AttentionMask::causal);
    } else {
      k::gqa_attention_backward(in, out.data(), lse.data(), dout.data(), grad, gd);
    }
  };
  const double flops = 2.0 * static_cast<double>(T) * static_cast<double>(T) *
                       static_cast<double>(hd) * static_cast<double>(heads);
  return {flops / seconds_per_call(forward) * 1e-9,
          3.5 * flops / seconds_per_call(forward_backward) * 1e-9};
}

double gemm_gflops(std::int64_t m, std::int64_t n, std::int64_t kk, bool trans_b) {
  std::vector<float> a(static_cast<std::size_t>(m * kk)), b(static_cast<std::size_t>(kk * n));
  std::vector<float> c(static_cast<std::size_t>(m * n));
  meshtrain::fill_normal(a, 1, 3, 0, 0.0f, 1.0f);
  meshtrain::fill_normal(b, 1, 4, 0, 0.0f, 1.0f);
  const double s = seconds_per_call([&] {
    meshtrain::kernels::gemm(a.data(), b.data(), c.data(), m, n, kk, false, trans_b, 1.0f, 0.0f);
  });
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kk) / s * 1e-9;
}

/// Per-thread scratch bytes per call. Old: forward T·d + T floats, backward 2·T·d + 2T
/// (kernels/cpu/attention.cpp). New: the largest block scratch of the forward and the two
/// backward passes (Br = 96, Bc = 48, head_dim padded to whole vectors, hdp; the carve-outs
/// of flash_attention.cpp and flash_attention_backward.cpp), independent of T.
std::int64_t scratch_bytes(bool tiled, std::int64_t T, std::int64_t hd) {
  if (!tiled) return 4 * (2 * T * hd + 2 * T);
  const std::int64_t br = 96, bc = 48, hdp = (hd + 7) / 8 * 8;
  const std::int64_t fwd = hd * br + 2 * bc * hdp + bc * br + br * hdp + 3 * br;
  const std::int64_t kv_pass = 2 * hd * bc + 2 * bc * hdp + 2 * br * hdp + 2 * br * bc;
  const std::int64_t q_pass = 2 * bc * hdp + br * hdp + 2 * hd * br + 2 * bc * br + 3 * br;
  return 4 * std::max({fwd, kv_pass, q_pass});
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  bool bf16 = true;
  TilePath bf16_path = meshtrain::kernels::cpu::flash::tile_path(meshtrain::DType::bf16);
  std::int64_t heads = 6, max_t = 8192, old_max_t = 2048;
  const std::int64_t hd = 64;
  for (int i = 1; i < argc; ++i) {
    const auto value = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0LL; };
    if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else if (std::strcmp(argv[i], "--bf16-portable") == 0) {
      bf16_path = TilePath::bf16_rounded;
    } else if (std::strcmp(argv[i], "--no-bf16") == 0) {
      bf16 = false;
    } else if (std::strcmp(argv[i], "--new-only") == 0) {
      old_max_t = 0;
    } else if (std::strcmp(argv[i], "--heads") == 0) {
      heads = value();
    } else if (std::strcmp(argv[i], "--max-t") == 0) {
      max_t = value();
    } else if (std::strcmp(argv[i], "--old-max-t") == 0) {
      old_max_t = value();
    } else {
      threads = std::atoi(argv[i]);
    }
  }
  if (threads < 1 || heads < 1 || (g_cpu_time && threads != 1)) {
    std::fprintf(stderr,
                 "usage: %s [threads] [--heads H] [--max-t T] [--old-max-t T] [--new-only] "
                 "[--no-bf16] [--bf16-portable] [--cpu-time (1 thread)]\n",
                 argv[0]);
    return 2;
  }
  meshtrain::kernels::set_num_threads(threads);
  std::printf(
      "attention_bench: %d thread(s), batch 1, %lld heads x head_dim %lld, causal, %s;"
      " GFLOP/s (fwd 2*T^2*d per head, fwd+bwd 3.5x); gemm 384^3 %.1f GFLOP/s; bf16 path %s\n",
      threads, static_cast<long long>(heads), static_cast<long long>(hd),
      g_cpu_time ? "thread CPU time" : "wall clock", gemm_gflops(384, 384, 384, false),
      bf16_path == TilePath::bf16_dot ? "avx512_bf16 dot" : "portable (rounded, f32 FMA)");
  std::printf("%6s | %9s %9s | %9s %9s | %7s %7s | %9s %9s %7s %7s | %9s | %11s %11s\n", "T",
              "old fwd", "new fwd", "old f+b", "new f+b", "fwd x", "f+b x", "bf16 fwd", "bf16 f+b",
              "fwd x", "f+b x", "gemm", "old scratch", "new scratch");
  for (std::int64_t T = 256; T <= max_t; T *= 2) {
    const std::int64_t old_heads = T > old_max_t ? 1 : heads;
    const Rates old_r = old_max_t > 0 ? time_kernel(false, T, old_heads, hd) : Rates{0.0, 0.0};
    const Rates new_r = time_kernel(true, T, heads, hd);
    const Rates bf_r = bf16 ? time_kernel(true, T, heads, hd, bf16_path) : Rates{0.0, 0.0};
    char gemm_text[32] = "        -";
    if (T <= 2048) std::snprintf(gemm_text, sizeof gemm_text, "%9.1f", gemm_gflops(T, T, hd, true));
    std::printf(
        "%6lld | %8.2f%s %9.2f | %8.2f%s %9.2f | %6.1fx %6.1fx | %9.2f %9.2f %6.2fx %6.2fx | %s | "
        "%11lld %11lld\n",
        static_cast<long long>(T), old_r.fwd, old_heads == heads ? " " : "*", new_r.fwd,
        old_r.fwd_bwd, old_heads == heads ? " " : "*", new_r.fwd_bwd, new_r.fwd / old_r.fwd,
        new_r.fwd_bwd / old_r.fwd_bwd, bf_r.fwd, bf_r.fwd_bwd, bf_r.fwd / new_r.fwd,
        bf_r.fwd_bwd / new_r.fwd_bwd, gemm_text,
        static_cast<long long>(scratch_bytes(false, T, hd)),
        static_cast<long long>(scratch_bytes(true, T, hd)));
    std::fflush(stdout);
  }
  return 0;
}
