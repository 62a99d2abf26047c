// tests/unit/kernels/flash_attention_bf16_test.cpp
//
// Tests of the chunk attention kernels with bf16 tile operands (AttentionChunkDims::operands;
// kernels/cpu/flash_operands.h):
//   - bf16_round is bitwise core/half.h's f32_to_bf16;
//   - bf16 against the f32 kernel within the bf16 tolerance derived below, for every mask
//     kind (causal with offsets, full, skip), GQA ratios 1, 2, 4, lengths off the blocks;
//   - that bf16 really rounds: it equals a double reference that rounds the same operands
//     (Q, K, V, dO, P, dS) far more closely than the f32 kernel does;
//   - the AVX512_BF16 and AMX paths against the portable one (same roundings, other summation
//     order), on the machines that have them;
//   - bitwise equality with 1 and 2 threads; f16 operands MT_CHECK.
//
// Tolerance. Rounding to bf16 (8 significant bits, ties to even) changes a value by at most
// u = 2⁻⁹ relative. A tile product of two rounded operands is then off by at most 2u·Σ|aᵢbᵢ|
// (the bf16 × bf16 products are exact in f32, f32 sums add ~2⁻²⁴ per term). Forward, O goes
// through two products (S = Q·Kᵀ, then P·V with P rounded: 2u + 2u), backward dQ/dK through
// up to three (dP = dO·Vᵀ, dS rounded, dS·K): so at most ≈ 6u–8u = 3–4 × 2⁻⁸ relative to the
// sizes of the terms. Measured against each tensor's largest element (T = 100 … 4096, GQA 1, 2,
// 4, head_dim 40 and 64, N(0, 1) inputs) the worst differences are 0.7 × 2⁻⁸ (out), 1.1–1.3
// (dq), 1.2–2.3 (dk), 0.5–0.9 (dv), lse ≤ 5e-3 absolute: random errors partly cancel. The
// tests allow 4 × 2⁻⁸ of the largest element of each f32 result (normwise), and 4 × 2⁻⁸
// absolute for lse (an error of S, whose entries are O(1) here).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/core/half.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/cpu/flash_operands.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

using cpu::flash::TilePath;

constexpr double kBf16Tol = 4.0 / 256.0;  // 4 × 2⁻⁸, derived in the file comment
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::size_t zu(std::int64_t i) { return static_cast<std::size_t>(i); }

// The paths beside the portable one that this machine runs (the dot path needs AVX512_BF16
// and 16-float vectors in the build; the AMX path the build's AMX and the CPU's, amx_usable):
// tests are instantiated only with those, so no run skips.
std::vector<TilePath> fast_bf16_paths() {
  std::vector<TilePath> paths;
  if (cpu::flash::kHasBf16Dot) paths.push_back(TilePath::bf16_dot);
  if (cpu::flash::amx_usable()) paths.push_back(TilePath::bf16_amx);
  return paths;
}

std::string path_name(TilePath path) {
  switch (path) {
    case TilePath::f32: return "f32";
    case TilePath::bf16_rounded: return "bf16_rounded";
    case TilePath::bf16_dot: return "bf16_dot";
    case TilePath::bf16_amx: return "bf16_amx";
  }
  return "?";
}

/// A chunk pair with contiguous rows (q/out/dout stride heads·d, k/v stride kv_heads·d) and one
/// spare row per sequence, so writes outside the chunk would show.
struct Pair {
  AttentionChunkDims d;
  AttentionMask mask;
  std::vector<float> q, k, v, dout;
  std::int64_t qs() const { return d.heads * d.head_dim; }
  std::int64_t kvs() const { return d.kv_heads * d.head_dim; }
  QkvRows rows() const { return {q.data(), k.data(), v.data(), qs(), kvs()}; }
};

Pair make_pair(std::int64_t batch, std::int64_t q_len, std::int64_t kv_len, std::int64_t heads,
               std::int64_t kv_heads, std::int64_t head_dim, std::int64_t q_offset,
               std::int64_t kv_offset, AttentionMask mask) {
  Pair p{{batch, q_len, kv_len, heads, kv_heads, head_dim, q_offset, kv_offset, q_len + 1,
          kv_len + 1, q_len + 1},
         mask,
         {},
         {},
         {},
         {}};
  const auto randn = [](std::size_t n, std::uint64_t stream) {
    std::vector<float> x(n);
    fill_normal(x, 77, stream, 0, 0.0f, 1.0f);
    return x;
  };
  const std::size_t qn = zu(batch * p.d.q_seq_rows * p.qs());
  const std::size_t kvn = zu(batch * p.d.kv_seq_rows * p.kvs());
  p.q = randn(qn, 1);
  p.k = randn(kvn, 2);
  p.v = randn(kvn, 3);
  p.dout = randn(qn, 4);
  return p;
}

struct Outputs {
  std::vector<float> out, lse, delta, dq, dk, dv;
};

/// Forward, D and backward of one pair on `path` (operands field as given in p.d).
Outputs run_path(const Pair& p, TilePath path) {
  const std::size_t qn = p.q.size(), kvn = p.k.size();
  const std::size_t ln = zu(p.d.batch * p.d.heads * p.d.lse_seq_len);
  Outputs r{std::vector<float>(qn, 0.0f),  std::vector<float>(ln, 0.0f),
            std::vector<float>(ln, 0.0f),  std::vector<float>(qn, 0.0f),
            std::vector<float>(kvn, 0.0f), std::vector<float>(kvn, 0.0f)};
  cpu::flash::chunk_forward(path, p.rows(), p.d, p.mask, r.out.data(), p.qs(), r.lse.data());
  attention_delta(r.out.data(), p.dout.data(), p.qs(), p.d, r.delta.data());
  cpu::flash::chunk_backward(path, p.rows(), p.dout.data(), p.qs(), r.lse.data(), r.delta.data(),
                             {r.dq.data(), r.dk.data(), r.dv.data(), p.qs(), p.kvs()}, p.d, p.mask);
  return r;
}

/// The same through the public entry points with dims.operands = `operands`.
Outputs run_public(Pair p, DType operands) {
  p.d.operands = operands;
  const std::size_t qn = p.q.size(), kvn = p.k.size();
  const std::size_t ln = zu(p.d.batch * p.d.heads * p.d.lse_seq_len);
  Outputs r{std::vector<float>(qn, 0.0f),  std::vector<float>(ln, 0.0f),
            std::vector<float>(ln, 0.0f),  std::vector<float>(qn, 0.0f),
            std::vector<float>(kvn, 0.0f), std::vector<float>(kvn, 0.0f)};
  attention_chunk_forward(p.rows(), p.d, p.mask, r.out.data(), p.qs(), r.lse.data());
  attention_delta(r.out.data(), p.dout.data(), p.qs(), p.d, r.delta.data());
  attention_chunk_backward(p.rows(), p.dout.data(), p.qs(), r.lse.data(), r.delta.data(),
                           {r.dq.data(), r.dk.data(), r.dv.data(), p.qs(), p.kvs()}, p.d, p.mask);
  return r;
}

/// max |a − b| / max |b| (0 when both are zero); equal infinities count as equal.
template <class T>
double normwise(const std::vector<float>& a, const std::vector<T>& b) {
  double diff = 0.0, size = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = static_cast<double>(b[i]);
    if (std::isinf(y)) {
      diff = x == y ? diff : std::numeric_limits<double>::infinity();
      continue;
    }
    diff = std::max(diff, std::abs(x - y));
    size = std::max(size, std::abs(y));
  }
  return size == 0.0 ? diff : diff / size;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // also −inf == −inf
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return diff;
}

/// The fraction of elements of a that differ from b by more than rel × max |b|.
double far_fraction(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  double size = 0.0;
  for (const float y : b) size = std::max(size, std::abs(static_cast<double>(y)));
  std::size_t far = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    far += std::abs(static_cast<double>(a[i]) - b[i]) > rel * size ? 1 : 0;
  return a.empty() ? 0.0 : static_cast<double>(far) / static_cast<double>(a.size());
}

struct Case {
  Pair p;
  std::string what;
};

std::vector<Case> cases() {
  const AttentionMask causal = AttentionMask::causal, full = AttentionMask::full;
  return {{make_pair(2, 100, 100, 4, 4, 64, 0, 0, causal), "causal, MHA, T 100"},
          {make_pair(1, 257, 257, 4, 2, 40, 0, 0, causal), "causal, GQA 2, T 257, d 40"},
          {make_pair(2, 37, 130, 8, 2, 16, 130, 37, causal), "causal, offsets, GQA 4"},
          {make_pair(1, 100, 37, 4, 1, 64, 96, 64, causal), "causal, offsets, GQA 4, kv 37"},
          {make_pair(2, 70, 90, 2, 2, 64, 0, 0, full), "full, T 70 × 90"},
          {make_pair(1, 49, 97, 4, 2, 32, 500, 0, full), "full, GQA 2"},
          {make_pair(2, 64, 64, 2, 1, 16, 0, 64, AttentionMask::skip), "skip"}};
}

TEST(FlashAttentionBf16, RoundingIsHalfHsF32ToBf16) {
  std::vector<float> xs = {0.0f,          -0.0f,
                           1.0f,          -1.5f,
                           1e-40f,        -3e-39f,
                           3.4028235e38f, std::numeric_limits<float>::infinity(),
                           kNegInf,       std::numeric_limits<float>::quiet_NaN()};
  for (std::uint32_t bits : {0x3f808000U, 0x3f818000U, 0x3f80ffffU, 0x7f7f8000U, 0xff800001U}) {
    xs.push_back(std::bit_cast<float>(bits));  // ties to even either way, near-max, a NaN
  }
  std::vector<float> random(4096);
  fill_normal(random, 5, 6, 0, 0.0f, 100.0f);
  xs.insert(xs.end(), random.begin(), random.end());
  for (const float x : xs) {
    EXPECT_EQ(cpu::flash::bf16_round_bits(x), static_cast<std::uint32_t>(f32_to_bf16(x)) << 16)
        << std::bit_cast<std::uint32_t>(x);
  }
}

TEST(FlashAttentionBf16, MatchesTheF32KernelWithinBf16Tolerance) {
  for (const Case& c : cases()) {
    const Outputs f = run_public(c.p, DType::f32), h = run_public(c.p, DType::bf16);
    EXPECT_LE(normwise(h.out, f.out), kBf16Tol) << "out, " << c.what;
    EXPECT_LE(max_abs_diff(h.lse, f.lse), kBf16Tol) << "lse, " << c.what;
    EXPECT_LE(normwise(h.dq, f.dq), kBf16Tol) << "dq, " << c.what;
    EXPECT_LE(normwise(h.dk, f.dk), kBf16Tol) << "dk, " << c.what;
    EXPECT_LE(normwise(h.dv, f.dv), kBf16Tol) << "dv, " << c.what;
    if (c.p.mask == AttentionMask::skip) {
      EXPECT_EQ(h.out, f.out) << c.what;  // zeros and −inf, no product at all
      EXPECT_EQ(h.lse, f.lse) << c.what;
      EXPECT_EQ(h.dq, f.dq) << c.what;
    } else {  // rounding happened: nonzero differences, of bf16 size (not f32's ~2⁻²⁴)
      EXPECT_GT(normwise(h.out, f.out), 1.0 / 8192) << "out unchanged by bf16, " << c.what;
      EXPECT_GT(normwise(h.dq, f.dq), 1.0 / 8192) << "dq unchanged by bf16, " << c.what;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A double reference that rounds what the bf16 kernel rounds

double r16(double x) { return cpu::flash::bf16_round(static_cast<float>(x)); }

struct Rounded {
  std::vector<double> out, dq, dk, dv;
};

/// Attention of one pair with Q, K, V, dO and the P̃ (forward) / P, dS (backward) operands
/// rounded to bf16 and everything else in double. P̃ = exp(S − row max), the kernel's own
/// P̃ when the pair has one key block (the online softmax then never rescales); backward reads
/// the kernel's lse and D. head_dim must make the scale a power of two (the kernel rounds
/// scale·Q, the reference rounds Q).
Rounded rounded_reference(const Pair& p, const Outputs& kernel) {
  const AttentionChunkDims& d = p.d;
  const std::int64_t hd = d.head_dim, group = d.heads / d.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Rounded r{std::vector<double>(p.q.size()), std::vector<double>(p.q.size()),
            std::vector<double>(p.k.size()), std::vector<double>(p.k.size())};
  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t h = 0; h < d.heads; ++h) {
      const auto qa = [&](std::int64_t i) { return zu((b * d.q_seq_rows + i) * p.qs() + h * hd); };
      const auto ka = [&](std::int64_t j) {
        return zu((b * d.kv_seq_rows + j) * p.kvs() + h / group * hd);
      };
      for (std::int64_t i = 0; i < d.q_len; ++i) {
        const std::size_t la = zu((b * d.heads + h) * d.lse_seq_len + i);
        std::vector<double> s(zu(d.kv_len), -std::numeric_limits<double>::infinity());
        double m = s[0];
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          if (p.mask == AttentionMask::causal && d.kv_offset + j > d.q_offset + i) continue;
          double dot = 0.0;
          for (std::int64_t c = 0; c < hd; ++c) dot += r16(p.q[qa(i) + c]) * r16(p.k[ka(j) + c]);
          s[zu(j)] = dot * scale;
          m = std::max(m, s[zu(j)]);
        }
        double l = 0.0;
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          if (s[zu(j)] == -std::numeric_limits<double>::infinity()) continue;
          const double pt = std::exp(s[zu(j)] - m);
          l += pt;
          for (std::int64_t c = 0; c < hd; ++c) r.out[qa(i) + c] += r16(pt) * r16(p.v[ka(j) + c]);
        }
        if (l == 0.0) continue;  // no visible key: out 0, no gradient
        for (std::int64_t c = 0; c < hd; ++c) r.out[qa(i) + c] /= l;
        for (std::int64_t j = 0; j < d.kv_len; ++j) {
          if (s[zu(j)] == -std::numeric_limits<double>::infinity()) continue;
          const double pr = std::exp(s[zu(j)] - kernel.lse[la]);
          double dp = 0.0;
          for (std::int64_t c = 0; c < hd; ++c) dp += r16(p.dout[qa(i) + c]) * r16(p.v[ka(j) + c]);
          const double ds = r16(pr * (dp - kernel.delta[la]));
          for (std::int64_t c = 0; c < hd; ++c) {
            r.dq[qa(i) + c] += scale * ds * r16(p.k[ka(j) + c]);
            r.dk[ka(j) + c] += scale * ds * r16(p.q[qa(i) + c]);
            r.dv[ka(j) + c] += r16(pr) * r16(p.dout[qa(i) + c]);
          }
        }
      }
    }
  }
  return r;
}

TEST(FlashAttentionBf16, EqualsAReferenceThatRoundsTheSameOperands) {
  // One key block (kv_len ≤ 48, odd: a VNNI pair with a zero partner), two query blocks,
  // head_dim 64 (scale 1/8): the bf16 kernel rounds exactly the reference's values, up to
  // f32 sums and the rare bf16 tie that f32 vs double exp puts on the other side.
  for (const Case& c :
       {Case{make_pair(2, 130, 45, 4, 2, 64, 100, 80, AttentionMask::causal), "causal"},
        Case{make_pair(1, 100, 47, 2, 1, 16, 60, 0, AttentionMask::full), "full"}}) {
    std::vector<TilePath> paths = fast_bf16_paths();
    paths.push_back(TilePath::bf16_rounded);
    for (const TilePath path : paths) {
      const Outputs h = run_path(c.p, path), f = run_path(c.p, TilePath::f32);
      const Rounded want = rounded_reference(c.p, h);
      const std::string what = c.what + ", " + path_name(path);
      // The bf16 kernel sits on the rounded reference (1e-4, f32-sum sized), the f32 kernel
      // a bf16 rounding away from it (> 1e-3): the bf16 path did round, and rounded these.
      EXPECT_LE(normwise(h.out, want.out), 1e-4) << "out, " << what;
      EXPECT_LE(normwise(h.dq, want.dq), 1e-4) << "dq, " << what;
      EXPECT_LE(normwise(h.dk, want.dk), 1e-4) << "dk, " << what;
      EXPECT_LE(normwise(h.dv, want.dv), 1e-4) << "dv, " << what;
      EXPECT_GT(normwise(f.out, want.out), 1e-3) << "out, " << what;
      EXPECT_GT(normwise(f.dq, want.dq), 1e-3) << "dq, " << what;
    }
  }
}

// bf16 selects the AMX path where the build has it and Linux grants the tile state, else the
// AVX512_BF16 path where the build has it, the portable one elsewhere.
TEST(FlashAttentionBf16, Bf16SelectsTheFastestPathTheMachineHas) {
  const TilePath want = cpu::flash::amx_usable() ? TilePath::bf16_amx
                        : cpu::flash::kHasBf16Dot ? TilePath::bf16_dot
                                                  : TilePath::bf16_rounded;
  EXPECT_EQ(cpu::flash::tile_path(DType::bf16), want);
  EXPECT_EQ(cpu::flash::tile_path(DType::f32), TilePath::f32);
  // amx_usable needs the build's AMX (and 16-float vectors) and this CPU's AMX-TILE/AMX-BF16.
  if (cpu::flash::amx_usable()) {
    EXPECT_TRUE(cpu::flash::kHasAmx);
    EXPECT_TRUE(__builtin_cpu_supports("amx-bf16"));
  }
}

class FlashAttentionBf16Path : public ::testing::TestWithParam<TilePath> {};

TEST_P(FlashAttentionBf16Path, MatchesThePortablePath) {
  for (const Case& c : cases()) {
    const Outputs dot = run_path(c.p, GetParam());
    const Outputs port = run_path(c.p, TilePath::bf16_rounded);
    // Same roundings; only the f32 summation order differs (pairs, odd element first; AMX
    // sums 16 pairs per instruction in its own order), and a P or dS that lands on the other
    // side of a bf16 rounding boundary because of it. AMX's order moves more S entries by an
    // ulp, so more such flips: 1e-3 (measured ≤ 3.9e-4) against the dot path's 2e-4. Beyond the
    // flips the paths agree to f32 sums: at most 1 % of the elements differ by more than 1e-5
    // of the largest.
    const double tol = GetParam() == TilePath::bf16_amx ? 1e-3 : 2e-4;
    EXPECT_LE(normwise(dot.out, port.out), tol) << "out, " << c.what;
    EXPECT_LE(max_abs_diff(dot.lse, port.lse), 1e-5) << "lse, " << c.what;
    EXPECT_LE(normwise(dot.dq, port.dq), tol) << "dq, " << c.what;
    EXPECT_LE(normwise(dot.dk, port.dk), tol) << "dk, " << c.what;
    EXPECT_LE(normwise(dot.dv, port.dv), tol) << "dv, " << c.what;
    EXPECT_LE(far_fraction(dot.out, port.out, 1e-5), 0.01) << "out, " << c.what;
    EXPECT_LE(far_fraction(dot.dq, port.dq, 1e-5), 0.01) << "dq, " << c.what;
    EXPECT_LE(far_fraction(dot.dk, port.dk, 1e-5), 0.01) << "dk, " << c.what;
    EXPECT_LE(far_fraction(dot.dv, port.dv, 1e-5), 0.01) << "dv, " << c.what;
  }
}

INSTANTIATE_TEST_SUITE_P(Build, FlashAttentionBf16Path, ::testing::ValuesIn(fast_bf16_paths()),
                         [](const ::testing::TestParamInfo<TilePath>& param) {
                           return path_name(param.param);
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FlashAttentionBf16Path);

TEST(FlashAttentionBf16, OneAndTwoThreadsGiveTheSameBits) {
  const int saved = num_threads();
  for (const Case& c : cases()) {
    set_num_threads(1);
    const Outputs one = run_public(c.p, DType::bf16);
    set_num_threads(2);
    const Outputs two = run_public(c.p, DType::bf16);
    EXPECT_EQ(one.out, two.out) << c.what;
    EXPECT_EQ(one.lse, two.lse) << c.what;
    EXPECT_EQ(one.dq, two.dq) << c.what;
    EXPECT_EQ(one.dk, two.dk) << c.what;
    EXPECT_EQ(one.dv, two.dv) << c.what;
  }
  set_num_threads(saved);
}

TEST(FlashAttentionBf16DeathTest, F16OperandsAreRejected) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Pair p = make_pair(1, 8, 8, 2, 2, 16, 0, 0, AttentionMask::causal);
  p.d.operands = DType::f16;
  std::vector<float> out(p.q.size()), lse(zu(2 * p.d.lse_seq_len));
  EXPECT_DEATH(attention_chunk_forward(p.rows(), p.d, p.mask, out.data(), p.qs(), lse.data()),
               "operands must be f32 or bf16");
}

}  // namespace
}  // namespace meshtrain::kernels
