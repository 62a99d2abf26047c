// src/meshtrain/kernels/cpu/gemm.cpp
//
// C = alpha·op(A)·op(B) + beta·C through oneDNN's matmul primitive (oneDNN v2 API). The
// transposes are not copies: they are the strides of the memory descriptors. Creating a
// primitive costs far more than running a small one (it picks and JIT-compiles a kernel), so
// each shape is created once and kept in a process-wide cache; a training step then only
// wraps its pointers and executes.
//
// gemm_16bit runs the same primitive with bf16 or f16 sources and an f32 destination: oneDNN
// multiplies 16-bit values and accumulates in f32 (on this CPU the brgemm kernel for
// avx512_core_bf16, about twice the f32 rate). Debian's oneDNN 2.6 has no CPU matmul for f16
// sources (primitive creation fails with "could not create a primitive descriptor iterator";
// f16 kernels arrived with oneDNN 3.x for avx512_core_fp16), so where creation fails for a
// dtype the 16-bit operands are widened to f32 (exactly) and the f32 GEMM runs: the same math,
// 16-bit inputs with f32 accumulation, at the f32 rate.
#include <omp.h>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/core/half.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

struct GemmKey {
  std::int64_t m;
  std::int64_t n;
  std::int64_t k;
  DType dtype;  // of A and B (f32, bf16 or f16); C is always f32
  bool trans_a;
  bool trans_b;
  bool accumulate;           // beta == 1
  std::uint32_t alpha_bits;  // alpha is baked into the primitive as its output scale
  // oneDNN partitions the work for the thread count seen at creation (its own cache keys on
  // it too), so a primitive made for 1 thread would run serial after set_num_threads(2).
  int threads;

  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& key) const noexcept {
    // boost::hash_combine's mixing; collisions only cost a comparison.
    std::size_t h = 0;
    const auto mix = [&h](std::uint64_t v) {
      h ^= std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    mix(static_cast<std::uint64_t>(key.m));
    mix(static_cast<std::uint64_t>(key.n));
    mix(static_cast<std::uint64_t>(key.k));
    mix((key.trans_a ? 1U : 0U) | (key.trans_b ? 2U : 0U) | (key.accumulate ? 4U : 0U) |
        (static_cast<std::uint64_t>(key.dtype) << 3));
    mix(key.alpha_bits);
    mix(static_cast<std::uint64_t>(key.threads));
    return h;
  }
};

struct GemmPrimitive {
  dnnl::matmul matmul;
  dnnl::memory::desc a_md;
  dnnl::memory::desc b_md;
  dnnl::memory::desc c_md;
};

dnnl::memory::data_type dnnl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return dnnl::memory::data_type::f32;
    case DType::bf16:
      return dnnl::memory::data_type::bf16;
    case DType::f16:
      return dnnl::memory::data_type::f16;
    case DType::i32:
      break;
  }
  MT_CHECK(false, "gemm: no matmul for {} operands", to_string(dtype));
  return dnnl::memory::data_type::undef;
}

GemmPrimitive create_primitive(const dnnl::engine& engine, const GemmKey& key) {
  using dims = dnnl::memory::dims;
  const auto f32 = dnnl::memory::data_type::f32;
  const auto src = dnnl_type(key.dtype);
  // Row-major [rows, cols] has strides {cols, 1}; its transpose read as [cols, rows] has
  // strides {1, cols}. oneDNN accepts any strides, so op(A) and op(B) need no copy.
  const dims a_strides = key.trans_a ? dims{1, key.m} : dims{key.k, 1};
  const dims b_strides = key.trans_b ? dims{1, key.k} : dims{key.n, 1};
  GemmPrimitive p;
  p.a_md = dnnl::memory::desc({key.m, key.k}, src, a_strides);
  p.b_md = dnnl::memory::desc({key.k, key.n}, src, b_strides);
  p.c_md = dnnl::memory::desc({key.m, key.n}, f32, dims{key.n, 1});

  // oneDNN v2 computes dst = sum_scale·dst + output_scale·(src·weights): alpha is the
  // output scale and beta = 1 is a sum post-op (developer guide, "Primitive Attributes:
  // Post-ops", sum).
  dnnl::primitive_attr attr;
  float alpha = 0.0f;
  std::memcpy(&alpha, &key.alpha_bits, sizeof alpha);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc(p.a_md, p.b_md, p.c_md);
  p.matmul = dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, engine));
  return p;
}

class GemmCache {
 public:
  static GemmCache& instance() {
    static GemmCache cache;
    return cache;
  }

  const dnnl::engine& engine() const { return engine_; }

  /// The cached primitive for key, created on first use. Entries are never erased and
  /// unordered_map nodes never move, so the reference outlives the lock.
  const GemmPrimitive& get(const GemmKey& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      try {
        it = cache_.emplace(key, create_primitive(engine_, key)).first;
      } catch (const dnnl::error& e) {
        MT_CHECK(false, "oneDNN matmul {} m={} n={} k={} trans_a={} trans_b={}: {} (status {})",
                 to_string(key.dtype), key.m, key.n, key.k, key.trans_a, key.trans_b, e.what(),
                 static_cast<int>(e.status));
      }
    }
    return it->second;
  }

  /// Whether oneDNN has a CPU matmul for `dtype` sources here: probed once per dtype by
  /// creating a small primitive (f32 always has one).
  bool has_matmul(DType dtype) {
    const std::lock_guard<std::mutex> lock(mutex_);
    int& known = has_matmul_[static_cast<std::size_t>(dtype)];  // 0 unknown, 1 yes, 2 no
    if (known == 0) {
      try {
        create_primitive(engine_, GemmKey{16, 16, 16, dtype, false, false, false,
                                          std::bit_cast<std::uint32_t>(1.0f), 1});
        known = 1;
      } catch (const dnnl::error&) {
        known = 2;
      }
    }
    return known == 1;
  }

 private:
  GemmCache() : engine_(dnnl::engine::kind::cpu, 0) {}

  dnnl::engine engine_;
  std::mutex mutex_;
  std::unordered_map<GemmKey, GemmPrimitive, GemmKeyHash> cache_;
  std::array<int, 4> has_matmul_{};  // by DType
};

// The checks and the empty cases shared by gemm and gemm_16bit. Returns true when C is done.
bool trivial_gemm(float* c, std::int64_t m, std::int64_t n, std::int64_t k, float beta) {
  MT_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm: negative dims m={} n={} k={}", m, n, k);
  MT_CHECK(beta == 0.0f || beta == 1.0f, "gemm: beta must be 0 or 1, got {}", beta);
  if (m == 0 || n == 0) return true;
  if (k == 0) {  // an empty sum: C = beta·C, nothing for oneDNN to do
    if (beta == 0.0f) std::memset(c, 0, static_cast<std::size_t>(m * n) * sizeof(float));
    return true;
  }
  return false;
}

// A and B of `dtype`, C f32; dims checked and non-empty.
void run_matmul(const void* a, const void* b, float* c, std::int64_t m, std::int64_t n,
                std::int64_t k, bool trans_a, bool trans_b, float alpha, float beta, DType dtype) {
  const GemmKey key{m,
                    n,
                    k,
                    dtype,
                    trans_a,
                    trans_b,
                    beta == 1.0f,
                    std::bit_cast<std::uint32_t>(alpha),
                    omp_get_max_threads()};
  GemmCache& cache = GemmCache::instance();
  const GemmPrimitive& p = cache.get(key);

  // A stream per thread: oneDNN streams are not meant to be shared between threads that
  // execute concurrently; on the CPU engine a stream is a lightweight handle.
  thread_local dnnl::stream stream(cache.engine());
  // The wrappers only borrow the pointers (no copy, no allocation of data); oneDNN's API
  // takes void* even for inputs it never writes, hence the const_casts.
  dnnl::memory a_mem(p.a_md, cache.engine(), const_cast<void*>(a));
  dnnl::memory b_mem(p.b_md, cache.engine(), const_cast<void*>(b));
  dnnl::memory c_mem(p.c_md, cache.engine(), c);
  p.matmul.execute(stream,
                   {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  stream.wait();
}

}  // namespace

void gemm(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
          bool trans_a, bool trans_b, float alpha, float beta) {
  if (trivial_gemm(c, m, n, k, beta)) return;
  run_matmul(a, b, c, m, n, k, trans_a, trans_b, alpha, beta, DType::f32);
}

void gemm_16bit(const std::uint16_t* a, const std::uint16_t* b, float* c, std::int64_t m,
                std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, float alpha, float beta,
                DType dtype) {
  MT_CHECK(is_16bit_float(dtype), "gemm_16bit: operands must be bf16 or f16, not {}",
           to_string(dtype));
  if (trivial_gemm(c, m, n, k, beta)) return;
  if (GemmCache::instance().has_matmul(dtype)) {
    run_matmul(a, b, c, m, n, k, trans_a, trans_b, alpha, beta, dtype);
    return;
  }
  // Widened copies, kept per thread and grown to the largest GEMM seen, so that steady state
  // allocates nothing. Like oneDNN's own scratchpad they live outside the tracked allocator:
  // at most the two largest operands of one GEMM in f32.
  thread_local std::vector<float> a32, b32;
  const auto a_size = static_cast<std::size_t>(m * k), b_size = static_cast<std::size_t>(k * n);
  if (a32.size() < a_size) a32.resize(a_size);
  if (b32.size() < b_size) b32.resize(b_size);
  cast_16bit_to_f32(a, a32.data(), m * k, dtype);
  cast_16bit_to_f32(b, b32.data(), k * n, dtype);
  run_matmul(a32.data(), b32.data(), c, m, n, k, trans_a, trans_b, alpha, beta, DType::f32);
}

}  // namespace meshtrain::kernels
