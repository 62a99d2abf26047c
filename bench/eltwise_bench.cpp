// bench/eltwise_bench.cpp
//
// The element-wise kernels of a GPT training step (GELU fused with the fc bias, SwiGLU for
// Llama-style MLPs, LayerNorm, the f32 → bf16 cast of matmul inputs, AdamW, the grad-norm sum
// of squares, gradient zeroing) on the shapes of the 6-layer/384 model (T 256, micro-batch 4:
// 1024 rows, MLP width 1536, 10.6 M parameters), each rated in GB/s of the bytes it must move
// (every array read once and written once) against memcpy of the same bytes, measured side by
// side in the same run.
//
//   eltwise_bench [threads] [--rows R] [--c C] [--params N] [--rounds K] [--only NAME]
//                 [--cpu-time] [--dump PATH]
//
// "x memcpy" is the kernel's GB/s over memcpy's on the same byte count (src + dst of
// memcpy counted, so 1.0 means the kernel moves its bytes as fast as memcpy moves its own);
// above 1 is possible where a kernel reads more than it writes. Each figure is the median
// over K rounds (default 5) of the best of 2 windows of ≥ 0.2 s after a warm-up call; the
// rounds alternate the kernels so that a noisy neighbour hits all of them alike.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/core/half.h"
#include "meshtrain/kernels/kernels.h"

namespace {

namespace k = meshtrain::kernels;

bool g_cpu_time = false;

/// Wall time, or with --cpu-time this process's CPU time (all threads: divide by the thread
/// count for a per-thread figure), which a busy neighbour on a shared machine inflates less.
double now_s() {
  if (g_cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Best seconds per call of `call` over 2 windows of ≥ 0.2 s each (at least one call each).
double seconds_per_call(const std::function<void()>& call) {
  call();  // warm-up: pages, caches
  double best = 1e300;
  for (int w = 0; w < 2; ++w) {
    std::int64_t calls = 0;
    const double t0 = now_s();
    double t = t0;
    while (calls == 0 || t - t0 < 0.2) {
      call();
      ++calls;
      t = now_s();
    }
    best = std::min(best, (t - t0) / static_cast<double>(calls));
  }
  return best;
}

std::vector<float> filled(std::int64_t n, float lo, float hi, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525U + 1013904223U;  // LCG: deterministic, cheap
    x = lo + (hi - lo) * static_cast<float>(s >> 8) * 0x1p-24f;
  }
  return v;
}

struct Case {
  std::string name;
  double bytes;  // bytes the kernel must read plus write
  std::function<void()> call;
};

struct Shapes {
  std::int64_t rows = 1024;                 // tokens of a micro-batch: 4 × 256
  std::int64_t c = 384;                     // model width
  std::int64_t params = 10'700'000;         // ≈ 6L/384 GPT-2 with the char vocabulary
  std::int64_t f() const { return 4 * c; }  // MLP width
};

/// The buffers every case works on, allocated and first touched once.
struct Buffers {
  explicit Buffers(const Shapes& s)
      : f(4 * s.c),
        pre(filled(s.rows * f, -4.0f, 4.0f, 1)),
        dy(filled(s.rows * f, -1.0f, 1.0f, 2)),
        dx(s.rows * f),
        y(s.rows * f),
        bias(filled(f, -0.5f, 0.5f, 3)),
        neg_bias(bias.size()),
        dbias(f),
        x(filled(s.rows * s.c, -2.0f, 2.0f, 4)),
        x2(filled(s.rows * s.c, -2.0f, 2.0f, 5)),
        h(s.rows * s.c),
        ln_y(s.rows * s.c),
        ln_dx(s.rows * s.c),
        weight(filled(s.c, 0.5f, 1.5f, 6)),
        lbias(filled(s.c, -0.1f, 0.1f, 7)),
        dweight(s.c),
        dlbias(s.c),
        mean(s.rows),
        rstd(s.rows),
        cast_out(s.rows * f),
        w(filled(s.params, -0.1f, 0.1f, 8)),
        m(s.params),
        v(s.params),
        g(filled(s.params, -1e-2f, 1e-2f, 9)),
        zeroed(s.params),
        fused_w(w),
        fused_m(s.params),
        fused_v(s.params),
        fused_g(g) {
    for (std::size_t i = 0; i < bias.size(); ++i) neg_bias[i] = -bias[i];
    // The statistics layernorm_backward reads, also when --only leaves the forward out.
    k::layernorm_forward(x.data(), weight.data(), lbias.data(), ln_y.data(), mean.data(),
                         rstd.data(), s.rows, s.c, 1e-5f);
  }
  std::int64_t f;
  std::vector<float> pre, dy, dx, y, bias, neg_bias, dbias;
  bool bias_sign = false;  // bias_gelu_forward adds +bias and −bias in turn: pre stays bounded
  std::vector<float> x, x2, h, ln_y, ln_dx, weight, lbias, dweight, dlbias, mean, rstd;
  std::vector<std::uint16_t> cast_out;
  std::vector<float> w, m, v, g, zeroed;
  // The fused AdamW + zero case's own copies (never dumped: --dump stays comparable with
  // builds without that case). Its gradient is zero after the first call, so m and v decay
  // geometrically from there: no subnormal within a run's calls, and the update's time does
  // not depend on the values.
  std::vector<float> fused_w, fused_m, fused_v, fused_g;
};

std::vector<Case> make_cases(const Shapes& s, Buffers& b) {
  const std::int64_t rf = s.rows * s.f();
  const std::int64_t rc = s.rows * s.c;
  const double fl = sizeof(float);
  std::vector<Case> cases;
  // bias_gelu_forward: pre read + written, y written.
  cases.push_back({"bias_gelu_forward", 3.0 * fl * static_cast<double>(rf), [&b, s] {
                     b.bias_sign = !b.bias_sign;
                     const float* bias = b.bias_sign ? b.bias.data() : b.neg_bias.data();
                     k::bias_gelu_forward(b.pre.data(), bias, b.y.data(), s.rows, s.f());
                   }});
  // gelu_bias_backward: pre, dy read, dx written (the MLP passes dx = dy, which here would
  // change dy from call to call).
  cases.push_back({"gelu_bias_backward", 3.0 * fl * static_cast<double>(rf), [&b, s] {
                     k::gelu_bias_backward(b.pre.data(), b.dy.data(), b.dx.data(), b.dbias.data(),
                                           s.rows, s.f());
                   }});
  // SwiGLU (Llama's MLP) on [rows, F]: gate and up read, out written; the backward reads gate,
  // up and dout and writes dgate and dup (here into dx and y).
  cases.push_back({"swiglu_forward", 3.0 * fl * static_cast<double>(rf),
                   [&b, rf] { k::swiglu_forward(b.pre.data(), b.dy.data(), b.y.data(), rf); }});
  cases.push_back({"swiglu_backward", 5.0 * fl * static_cast<double>(rf), [&b, rf] {
                     k::swiglu_backward(b.pre.data(), b.dy.data(), b.dy.data(), b.dx.data(),
                                        b.y.data(), rf);
                   }});
  cases.push_back({"cast_f32_to_bf16", (fl + 2.0) * static_cast<double>(rf), [&b, rf] {
                     meshtrain::cast_f32_to_16bit(b.pre.data(), b.cast_out.data(), rf,
                                                  meshtrain::DType::bf16);
                   }});
  cases.push_back({"layernorm_forward", 2.0 * fl * static_cast<double>(rc), [&b, s] {
                     k::layernorm_forward(b.x.data(), b.weight.data(), b.lbias.data(),
                                          b.ln_y.data(), b.mean.data(), b.rstd.data(), s.rows, s.c,
                                          1e-5f);
                   }});
  cases.push_back({"residual_layernorm_forward", 4.0 * fl * static_cast<double>(rc), [&b, s] {
                     k::residual_layernorm_forward(
                         b.x.data(), b.x2.data(), b.h.data(), b.weight.data(), b.lbias.data(),
                         b.ln_y.data(), b.mean.data(), b.rstd.data(), s.rows, s.c, 1e-5f);
                   }});
  // x, dy, dresidual read, dx written.
  cases.push_back({"layernorm_backward", 4.0 * fl * static_cast<double>(rc), [&b, s] {
                     k::layernorm_backward(b.x.data(), b.weight.data(), b.mean.data(),
                                           b.rstd.data(), b.x2.data(), b.h.data(), b.ln_dx.data(),
                                           b.dweight.data(), b.dlbias.data(), s.rows, s.c);
                   }});
  // w, m, v read + written, g read.
  cases.push_back({"adamw_step", 7.0 * fl * static_cast<double>(s.params), [&b] {
                     const k::AdamWParams p{1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f, 1.0f};
                     k::adamw_step(b.w, b.m, b.v, b.g, p, 10);
                   }});
  // The same with the gradient zeroed in the pass (AdamWTensor::zero_g): one more write stream.
  cases.push_back({"adamw_step + zero grads", 8.0 * fl * static_cast<double>(s.params), [&b] {
                     const k::AdamWTensor t{b.fused_w,
                                            b.fused_m,
                                            b.fused_v,
                                            b.fused_g,
                                            k::AdamWParams{1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f, 1.0f},
                                            b.fused_g};
                     k::adamw_step_all({&t, 1}, 10);
                   }});
  cases.push_back({"sum_squares", fl * static_cast<double>(s.params), [&b, s] {
                     volatile double r = k::sum_squares(b.g.data(), s.params);
                     (void)r;
                   }});
  cases.push_back({"zero grads (memset)", fl * static_cast<double>(s.params),
                   [&b, s] { std::memset(b.zeroed.data(), 0, sizeof(float) * s.params); }});
  return cases;
}

template <typename T>
void write_all(std::FILE* out, const std::vector<T>& v) {
  std::fwrite(v.data(), sizeof(T), v.size(), out);
}

/// --dump: every case run twice (accumulating outputs accumulate twice), then every output
/// array written to `path` as raw bytes, for a bitwise comparison of two builds (cmp).
int dump(const Shapes& s, const std::string& path) {
  Buffers b(s);
  std::vector<Case> cases = make_cases(s, b);
  double sum = 0.0;
  for (int rep = 0; rep < 2; ++rep) {
    for (const Case& c : cases) c.call();
    sum += k::sum_squares(b.g.data(), s.params);
  }
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "eltwise_bench: cannot write %s\n", path.c_str());
    return 1;
  }
  for (const auto* v : {&b.pre, &b.dx, &b.y, &b.dbias, &b.h, &b.ln_y, &b.ln_dx, &b.dweight,
                        &b.dlbias, &b.mean, &b.rstd, &b.w, &b.m, &b.v}) {
    write_all(out, *v);
  }
  write_all(out, b.cast_out);
  std::fwrite(&sum, sizeof sum, 1, out);
  std::fclose(out);
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Shapes s;
  int threads = 1;
  int rounds = 5;
  std::string dump_path;
  std::string only;  // run only the cases whose name contains this
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--rows" && has_value) {
      s.rows = std::atoll(argv[++i]);
    } else if (a == "--c" && has_value) {
      s.c = std::atoll(argv[++i]);
    } else if (a == "--params" && has_value) {
      s.params = std::atoll(argv[++i]);
    } else if (a == "--rounds" && has_value) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--cpu-time") {
      g_cpu_time = true;
    } else if (a == "--only" && has_value) {
      only = argv[++i];
    } else if (a == "--dump" && has_value) {
      dump_path = argv[++i];
    } else if (a[0] != '-') {
      threads = std::atoi(a.c_str());
    } else {
      std::fprintf(stderr,
                   "usage: eltwise_bench [threads] [--rows R] [--c C] [--params N] "
                   "[--rounds K] [--only NAME] [--cpu-time] [--dump PATH]\n");
      return 2;
    }
  }
  if (threads < 1 || rounds < 1 || s.rows < 1 || s.c < 1 || s.params < 1) {
    std::fprintf(stderr, "eltwise_bench: threads, rounds, rows, c and params must be ≥ 1\n");
    return 2;
  }
  omp_set_num_threads(threads);
  if (!dump_path.empty()) return dump(s, dump_path);
  Buffers b(s);
  std::vector<Case> cases = make_cases(s, b);
  std::erase_if(cases, [&only](const Case& c) { return c.name.find(only) == std::string::npos; });
  double most = 0.0;
  for (const Case& c : cases) most = std::max(most, c.bytes);
  // memcpy of each case's byte count: half of them read, half written.
  const auto copy_floats = static_cast<std::size_t>(most / 2.0 / sizeof(float)) + 1;
  const std::vector<float> copy_src = filled(static_cast<std::int64_t>(copy_floats), 0, 1, 10);
  std::vector<float> copy_dst(copy_floats);
  std::vector<std::vector<double>> kernel_s(cases.size()), copy_s(cases.size());
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const auto n = static_cast<std::size_t>(cases[c].bytes / 2.0);
      copy_s[c].push_back(seconds_per_call(
          [&copy_src, &copy_dst, n] { std::memcpy(copy_dst.data(), copy_src.data(), n); }));
      kernel_s[c].push_back(seconds_per_call(cases[c].call));
    }
  }
  std::printf("eltwise_bench: %d thread(s), rows %lld, C %lld, F %lld, params %lld, median of %d\n",
              threads, static_cast<long long>(s.rows), static_cast<long long>(s.c),
              static_cast<long long>(s.f()), static_cast<long long>(s.params), rounds);
  std::printf("%-28s %10s %10s %12s %9s\n", "kernel", "MB", "ms", "GB/s", "x memcpy");
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const double t = median(kernel_s[c]);
    const double tc = median(copy_s[c]);
    std::printf("%-28s %10.2f %10.3f %12.1f %9.2f\n", cases[c].name.c_str(), cases[c].bytes / 1e6,
                t * 1e3, cases[c].bytes / t / 1e9, tc / t);
  }
  return 0;
}
