// Mixed precision (docs/mixed_precision.md): the f32 ↔ bf16/f16 conversions of core/half.h
// (round to nearest even, NaN, inf, f16 overflow and subnormals; the AVX-512 bulk forms bitwise
// equal to the scalar ones, the scalar ones equal to an independent rounding in double), the
// 16-bit GEMM against the f32 GEMM of the rounded inputs, deferred weight gradients with 16-bit
// weights, the attention core's tile operands per weight dtype, and a whole CausalLm of each
// family with every parameter cast to bf16 or f16 against the same model in f32: loss,
// gradients (f32), and the activation bytes kept.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "support/placements.h"
#include "support/test_config.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/half.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/autocast.h"
#include "meshtrain/layers/weight_grad_queue.h"
#include "meshtrain/model/causal_lm.h"
#include "meshtrain/parallel/tp/parallel_linear.h"

namespace meshtrain {
namespace {

float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// ---------------------------------------------------------------------------------------------
// Scalar conversions: hand-picked cases

TEST(Half, Bf16RoundsToNearestTiesToEven) {
  // bf16 keeps 7 mantissa bits: its ulp at 1 is 2⁻⁷, so 1 + 2⁻⁸ is a tie.
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);             // tie → even (1.0)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);         // tie → even (1 + 2⁻⁶)
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie → up
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f - 0x1p-20f), 0x3f80);  // below the tie → down
  EXPECT_EQ(f32_to_bf16(-1.0f - 3 * 0x1p-8f), 0xbf82);        // symmetric in the sign
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_f32(0x3f81), 1.0f + 0x1p-7f);
}

TEST(Half, F16RoundsToNearestTiesToEven) {
  // f16 keeps 10 mantissa bits: its ulp at 1 is 2⁻¹⁰, so 1 + 2⁻¹¹ is a tie.
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);             // tie → even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie → even
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // above the tie → up
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f16_to_f32(0x3c01), 1.0f + 0x1p-10f);
  EXPECT_EQ(f16_to_f32(0x3555), 0x1.554p-2f);  // ≈ 1/3
}

TEST(Half, NanStaysNanAndInfStaysInf) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::uint32_t nan_bits : {0x7fc00000U, 0xffc00000U, 0x7f800001U, 0x7fa00000U}) {
    const float nan = from_bits(nan_bits);
    // A signalling NaN whose payload lies in the bits that are cut off must not become inf.
    const std::uint16_t b = f32_to_bf16(nan), h = f32_to_f16(nan);
    EXPECT_TRUE(std::isnan(bf16_to_f32(b))) << std::hex << nan_bits;
    EXPECT_TRUE(std::isnan(f16_to_f32(h))) << std::hex << nan_bits;
    EXPECT_EQ(b & 0x8000, (nan_bits >> 16) & 0x8000) << "sign kept";
    EXPECT_EQ(h & 0x8000, (nan_bits >> 16) & 0x8000) << "sign kept";
  }
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80);
  EXPECT_EQ(f32_to_f16(inf), 0x7c00);
  EXPECT_EQ(f32_to_f16(-inf), 0xfc00);
  EXPECT_EQ(bf16_to_f32(0xff80), -inf);
  EXPECT_EQ(f16_to_f32(0x7c00), inf);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
}

TEST(Half, F16OverflowsToInfAndBf16OnlyPastFltMax) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);    // largest finite f16
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);  // just below the midpoint to 2¹⁶
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);    // the midpoint: ties to even = inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-70000.0f), 0xfc00);
  EXPECT_EQ(f32_to_bf16(1e38f), f32_to_bf16(1e38f));  // finite, f32's range
  EXPECT_FALSE(std::isinf(bf16_to_f32(f32_to_bf16(3e38f))));
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f0000U)), 0x7f7f);  // largest finite bf16
  // FLT_MAX lies above the midpoint between the largest bf16 and 2¹²⁸: rounds to inf.
  EXPECT_EQ(f32_to_bf16(FLT_MAX), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-FLT_MAX), 0xff80);
}

TEST(Half, SubnormalsAreRoundedNotFlushed) {
  // f16 subnormals are multiples of 2⁻²⁴ below 2⁻¹⁴.
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);                // tie between 0 and 2⁻²⁴ → 0
  EXPECT_EQ(f32_to_f16(0x1.000002p-25f), 0x0001);         // just above the tie
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);            // 1.5 units: tie → even 2
  EXPECT_EQ(f32_to_f16(5 * 0x1p-25f), 0x0002);            // 2.5 units: tie → even 2
  EXPECT_EQ(f32_to_f16(1023 * 0x1p-24f), 0x03ff);         // largest subnormal
  EXPECT_EQ(f32_to_f16(1023.5f * 0x1p-24f), 0x0400);      // rounds up into the normals
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);                // smallest normal
  EXPECT_EQ(f32_to_f16(from_bits(0x00000001U)), 0x0000);  // an f32 subnormal: far below
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x83ff), -1023 * 0x1p-24f);
  // bf16 has f32's exponent range: f32 subnormals map to bf16 subnormals.
  EXPECT_EQ(f32_to_bf16(from_bits(0x00010000U)), 0x0001);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000U)), 0x0000);  // tie → even 0
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000U)), 0x0002);  // tie → even 2
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008001U)), 0x0001);
  EXPECT_EQ(bits_of(bf16_to_f32(0x0001)), 0x00010000U);
}

TEST(Half, EverySixteenBitValueRoundTrips) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float wide_b = bf16_to_f32(b), wide_h = f16_to_f32(b);
    if (std::isnan(wide_b)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(wide_b))));
    } else {
      ASSERT_EQ(f32_to_bf16(wide_b), b) << std::hex << h;
    }
    if (std::isnan(wide_h)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(wide_h))));
    } else {
      ASSERT_EQ(f32_to_f16(wide_h), b) << std::hex << h;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Scalar against an independent rounding, bulk against scalar

// x rounded to `mantissa_bits` kept bits with exponents ≥ min_exponent (below it: subnormals
// in units of 2^(min_exponent − mantissa_bits)), computed in double with std::nearbyint (round
// to nearest even in the default rounding mode); beyond `max_finite` rounds to inf as IEEE 754
// (the result of rounding with an unbounded exponent exceeds max_finite).
float reference_round(float x, int mantissa_bits, int min_exponent, double max_finite) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
  int exponent = 0;
  std::frexp(static_cast<double>(x), &exponent);  // |x| in [2^(e−1), 2^e)
  const int e = std::max(exponent - 1, min_exponent);
  const double ulp = std::ldexp(1.0, e - mantissa_bits);
  const double r = std::nearbyint(static_cast<double>(x) / ulp) * ulp;
  if (std::abs(r) > max_finite) return std::copysign(std::numeric_limits<float>::infinity(), x);
  return static_cast<float>(r);
}

// Float samples: every exponent of f32 with random mantissas (Philox bit patterns), dense
// around f16's range, plus the edge cases above; an odd count so the bulk tail is exercised.
std::vector<float> sample_floats() {
  std::vector<float> xs;
  for (std::uint64_t i = 0; i < 200001; ++i) {
    const std::uint64_t r = philox_u64(7, 11, i);
    auto bits = static_cast<std::uint32_t>(r);
    if (i % 2 == 0) {  // exponents 96 … 159: f16 subnormals to beyond its overflow
      const auto exponent = static_cast<std::uint32_t>(96 + (r >> 32) % 64);
      bits = (bits & 0x807fffffU) | (exponent << 23);
    }
    if (i % 7 == 0) bits &= 0xffffe000U | (static_cast<std::uint32_t>(r >> 40) & 0x1000U);  // ties
    xs.push_back(from_bits(bits));
  }
  for (const float x :
       {0.0f, -0.0f, 1.0f + 0x1p-8f, 65504.0f, 65520.0f, 0x1p-24f, 0x1p-25f, FLT_MAX, -FLT_MAX,
        FLT_MIN, from_bits(1), from_bits(0x00018000U), std::numeric_limits<float>::infinity(),
        from_bits(0x7f800001U), from_bits(0xffc00001U)}) {
    xs.push_back(x);
  }
  return xs;
}

TEST(Half, ScalarMatchesRoundingInDouble) {
  for (const float x : sample_floats()) {
    if (std::isnan(x)) continue;
    // bf16: 7 bits, exponents down to −126 (f32's), largest finite (2 − 2⁻⁷)·2¹²⁷ = 0x1.fep127.
    const float want_b = reference_round(x, 7, -126, 0x1.fep127);
    // f16: 10 bits, exponents down to −14, largest finite 65504.
    const float want_h = reference_round(x, 10, -14, 65504.0);
    ASSERT_EQ(bits_of(bf16_to_f32(f32_to_bf16(x))), bits_of(want_b)) << std::hexfloat << x;
    ASSERT_EQ(bits_of(f16_to_f32(f32_to_f16(x))), bits_of(want_h)) << std::hexfloat << x;
  }
}

TEST(Half, BulkCastsEqualScalarOnes) {
  const std::vector<float> xs = sample_floats();
  const auto n = static_cast<std::int64_t>(xs.size());
  for (const DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    const auto narrow = dtype == DType::bf16 ? f32_to_bf16 : f32_to_f16;
    const auto widen = dtype == DType::bf16 ? bf16_to_f32 : f16_to_f32;
    std::vector<std::uint16_t> half(xs.size());
    cast_f32_to_16bit(xs.data(), half.data(), n, dtype);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      ASSERT_EQ(half[i], narrow(xs[i])) << std::hexfloat << xs[i];
    }
    std::vector<float> wide(xs.size());
    cast_16bit_to_f32(half.data(), wide.data(), n, dtype);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      ASSERT_EQ(bits_of(wide[i]), bits_of(widen(half[i]))) << i;
    }
  }
}

TEST(Half, TensorToConvertsAmongFloatDtypes) {
  Tensor x = Tensor::empty({3, 5}, MemCategory::other);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = 0.1f * static_cast<float>(i) - 0.7f;
  const Tensor b = x.to(DType::bf16, MemCategory::activations);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.shape(), x.shape());
  EXPECT_EQ(b.category(), MemCategory::activations);
  EXPECT_EQ(b.bytes(), x.bytes() / 2);
  const Tensor h = b.to(DType::f16, MemCategory::other);  // bf16 → f16 through f32
  const Tensor back = h.to(DType::f32, MemCategory::other);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_EQ(b.u16()[i], f32_to_bf16(x.f32()[i]));
    EXPECT_EQ(h.u16()[i], f32_to_f16(bf16_to_f32(b.u16()[i])));
    EXPECT_EQ(back.f32()[i], f16_to_f32(h.u16()[i]));
  }
  // The same dtype is a copy, not a view.
  Tensor same = x.to(DType::f32, MemCategory::other);
  same.f32()[0] = 42.0f;
  EXPECT_NE(x.f32()[0], 42.0f);
  // A row view converts only its own rows.
  const Tensor rows = x.rows(1, 2).to(DType::f16, MemCategory::other);
  EXPECT_EQ(rows.numel(), 5);
  EXPECT_EQ(rows.u16()[0], f32_to_f16(x.f32()[5]));
}

// ---------------------------------------------------------------------------------------------
// The 16-bit GEMM

TEST(Gemm16Bit, EqualsF32GemmOfTheRoundedInputs) {
  struct Dims {
    std::int64_t m, n, k;
  };
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const Dims d : {Dims{7, 5, 3}, Dims{37, 29, 53}, Dims{128, 96, 200}}) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true}) {
          for (const float beta : {0.0f, 1.0f}) {
            for (const float alpha : {1.0f, 0.5f}) {
              SCOPED_TRACE(::testing::Message()
                           << to_string(dtype) << " m=" << d.m << " n=" << d.n << " k=" << d.k
                           << " trans_a=" << trans_a << " trans_b=" << trans_b << " beta=" << beta
                           << " alpha=" << alpha);
              const auto size = [](std::int64_t r, std::int64_t c) {
                return static_cast<std::size_t>(r * c);
              };
              std::vector<float> a(size(d.m, d.k)), b(size(d.k, d.n)), c0(size(d.m, d.n));
              fill_normal(a, 3, 1, 0, 0.0f, 1.0f);
              fill_normal(b, 3, 2, 0, 0.0f, 1.0f);
              fill_normal(c0, 3, 3, 0, 0.0f, 1.0f);
              std::vector<std::uint16_t> a16(a.size()), b16(b.size());
              cast_f32_to_16bit(a.data(), a16.data(), static_cast<std::int64_t>(a.size()), dtype);
              cast_f32_to_16bit(b.data(), b16.data(), static_cast<std::int64_t>(b.size()), dtype);
              // The reference: the f32 GEMM of the rounded (then exactly widened) inputs.
              cast_16bit_to_f32(a16.data(), a.data(), static_cast<std::int64_t>(a.size()), dtype);
              cast_16bit_to_f32(b16.data(), b.data(), static_cast<std::int64_t>(b.size()), dtype);
              std::vector<float> want = c0, got = c0;
              kernels::gemm(a.data(), b.data(), want.data(), d.m, d.n, d.k, trans_a, trans_b, alpha,
                            beta);
              kernels::gemm_16bit(a16.data(), b16.data(), got.data(), d.m, d.n, d.k, trans_a,
                                  trans_b, alpha, beta, dtype);
              // Both accumulate exact products (16-bit × 16-bit fits in f32) in f32, in
              // possibly different orders: ≤ k·2⁻²⁴ of Σ|a·b| apart, ≈ 1e-6 of max |C| here.
              double scale = 0.0;
              for (const float v : want) scale = std::max(scale, std::abs(static_cast<double>(v)));
              for (std::size_t i = 0; i < want.size(); ++i) {
                ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << "at " << i;
              }
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Layers: deferred weight gradients with 16-bit weights are the fused ones, bit for bit

TEST(MixedPrecisionLayers, AttentionCoreOperandsFollowTheQkvWeight) {
  // bf16 weights: bf16 tile operands; f16 (no f16 operand path) and f32: the f32 kernel.
  for (const auto& [dtype, want] :
       {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::bf16},
        std::pair{DType::f16, DType::f32}}) {
    Parameter p("attn.c_attn.weight", Shape{12, 4}, InitKind::zeros);
    p.value = p.value.to(dtype, MemCategory::params);
    EXPECT_EQ(attention_operands(p), want) << to_string(dtype);
  }
}

TEST(MixedPrecisionLayers, DeferredWeightGradsEqualFusedWithBf16Weights) {
  const auto one = single_rank_group("tp");
  const TensorParallel tp{*one};
  constexpr std::int64_t kTokens = 12, kIn = 16, kOut = 24;
  const auto run = [&](bool defer) {
    const PlacementTable records = test::records_table(
        {test::column_records("a", kOut, kIn, true), test::column_records("b", kOut, kIn, true),
         test::row_records("c", kIn, kOut, true)});
    ColumnParallelLinear col({{"a", 0.2f}, {"b", 0.2f}}, records, tp);
    RowParallelLinear row("c", records, 0.2f, tp);
    ParameterList params = col.parameters();
    for (Parameter* p : row.parameters()) params.push_back(p);
    for (Parameter* p : params) {
      initialize(*p, 5);
      if (p->init == InitKind::zeros) p->value.fill(0.25f);  // a bias that matters
      p->value = p->value.to(DType::bf16, MemCategory::params);
    }
    Tensor x = Tensor::empty({kTokens, kIn}, MemCategory::other);
    fill_normal(x.span_f32(), 9, 1, 0, 0.0f, 1.0f);
    const std::vector<Tensor> ys = col.forward(x, {});
    Tensor h = Tensor::empty(ys[0].shape(), MemCategory::activations);
    kernels::add(ys[0].f32(), ys[1].f32(), h.f32(), h.numel());
    const Tensor y = row.forward(h, {});
    Tensor dy = Tensor::empty(y.shape(), MemCategory::other);
    fill_normal(dy.span_f32(), 9, 2, 0, 0.0f, 1.0f);
    WeightGradQueue queue;
    Tensor dx;
    {
      const MicroBatchContext ctx{.slot = 0, .defer_weight_grads = defer ? &queue : nullptr};
      const Tensor dh = row.backward(dy, ctx);
      const std::vector<Tensor> dhs{dh, dh};
      dx = col.backward(dhs, ctx);
    }
    EXPECT_EQ(queue.pending(0), defer ? 3U : 0U);
    queue.run(0);
    std::vector<Tensor> out{dx};
    for (Parameter* p : params) {
      EXPECT_EQ(p->grad.dtype(), DType::f32) << p->name;
      out.push_back(p->grad.clone(MemCategory::other));
    }
    return out;
  };
  const std::vector<Tensor> fused = run(false), deferred = run(true);
  ASSERT_EQ(fused.size(), deferred.size());
  for (std::size_t i = 0; i < fused.size(); ++i) {
    EXPECT_EQ(
        std::memcmp(fused[i].f32(), deferred[i].f32(), static_cast<std::size_t>(fused[i].bytes())),
        0)
        << "tensor " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// A whole model in bf16 / f16 against f32

struct ModelRun {
  double loss = 0.0;                 // mean over the two micro-batches
  std::vector<Tensor> grads;         // f32, accumulated over both, divided by the loss scale
  std::int64_t activation_peak = 0;  // bytes above what was live before the forward
  std::vector<std::string> names;
};

ModelRun run_model(ModelFamily family, DType dtype, float loss_scale) {
  const auto one = single_rank_group("tp");
  ModelConfig mc = test::small_tp_config(family, 1, 1, false, 4, 1).model;
  mc.vocab_size = 65;
  CausalLm model(mc, /*seed=*/1234, TensorParallel{*one});
  // Biases and norm weights away from their initial 0 and 1, so that a 16-bit path that lost
  // or mangled one of them shows in the loss.
  for (Parameter* p : model.parameters()) {
    if (p->init == InitKind::normal) continue;
    for (std::int64_t i = 0; i < p->value.numel(); ++i) {
      p->value.f32()[i] += 0.1f * std::sin(static_cast<float>(i));
    }
  }
  // What the trainer does under training.precision = "bf16" / "fp16": every value cast once
  // (the f32 master copy would stay with the optimizer), the gradients left f32.
  if (dtype != DType::f32) {
    for (Parameter* p : model.parameters()) p->value = p->value.to(dtype, MemCategory::params);
  }
  constexpr std::int64_t kBatch = 4;
  const std::int64_t T = mc.block_size;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(kBatch * T)), targets(tokens.size());
  TrackedAllocator& alloc = TrackedAllocator::instance();
  alloc.reset_peaks();
  const std::int64_t before = alloc.stats(MemCategory::activations).current_bytes;
  ModelRun run;
  // Two micro-batches, so the gradients are accumulated (the weight-gradient GEMMs add into
  // the f32 grad, beta = 1). Targets are a fixed function of the token.
  for (std::uint64_t mb = 0; mb < 2; ++mb) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<std::int32_t>(philox_u64(1, 2 + mb, i) % 65);
      targets[i] = static_cast<std::int32_t>((tokens[i] * 7 + 3) % 65);
    }
    run.loss += model.forward(tokens.data(), targets.data(), kBatch, T, {}) / 2.0;
    model.backward(loss_scale / 2.0f, {});
  }
  run.activation_peak = alloc.stats(MemCategory::activations).peak_bytes - before;
  for (const Parameter* p : model.parameters()) {
    EXPECT_EQ(p->grad.dtype(), DType::f32) << p->name;
    EXPECT_EQ(p->value.dtype(), dtype) << p->name;
    Tensor g = p->grad.clone(MemCategory::other);
    kernels::scale_inplace(g.f32(), 1.0f / loss_scale, g.numel());  // a power of two: exact
    run.grads.push_back(std::move(g));
    run.names.push_back(p->name);
  }
  return run;
}

// ‖a − b‖ / ‖b‖ over the tensors of `which` (all when empty).
double relative_error(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                      std::vector<std::size_t> which = {}) {
  if (which.empty()) {
    for (std::size_t i = 0; i < a.size(); ++i) which.push_back(i);
  }
  double diff = 0.0, norm = 0.0;
  for (const std::size_t i : which) {
    for (std::int64_t j = 0; j < a[i].numel(); ++j) {
      const double d = static_cast<double>(a[i].f32()[j]) - static_cast<double>(b[i].f32()[j]);
      diff += d * d;
      norm += static_cast<double>(b[i].f32()[j]) * static_cast<double>(b[i].f32()[j]);
    }
  }
  return std::sqrt(diff / norm);
}

struct Tolerances {
  double loss;      // relative
  double grads;     // ‖g − g_f32‖ / ‖g_f32‖ over all parameters
  double per_grad;  // the same for each parameter alone
};

void expect_close_to_f32(ModelFamily family, DType dtype, float loss_scale,
                         const Tolerances& tol) {
  SCOPED_TRACE(std::string(to_string(family)) + " " + std::string(to_string(dtype)));
  const ModelRun want = run_model(family, DType::f32, 1.0f);
  const ModelRun got = run_model(family, dtype, loss_scale);
  const double loss_error = std::abs(got.loss - want.loss) / want.loss;
  const double grad_error = relative_error(got.grads, want.grads);
  double worst = 0.0;
  std::string worst_name;
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    const double e = relative_error(got.grads, want.grads, {i});
    EXPECT_LT(e, tol.per_grad) << want.names[i];
    if (e > worst) {
      worst = e;
      worst_name = want.names[i];
    }
  }
  EXPECT_LT(loss_error, tol.loss) << "loss " << got.loss << " vs f32 " << want.loss;
  EXPECT_LT(grad_error, tol.grads);
  // The matmul inputs are kept in 16 bits instead of 32.
  EXPECT_LT(got.activation_peak, want.activation_peak);
  std::printf(
      "%s %s: loss %.6f vs %.6f (rel %.2e), grads rel %.2e (worst %s %.2e), "
      "activation peak %lld vs %lld B (%.2f)\n",
      std::string(to_string(family)).c_str(), std::string(to_string(dtype)).c_str(), got.loss, want.loss, loss_error,
      grad_error, worst_name.c_str(), worst, static_cast<long long>(got.activation_peak),
      static_cast<long long>(want.activation_peak),
      static_cast<double>(got.activation_peak) / static_cast<double>(want.activation_peak));
}

// u = the unit roundoff, 2⁻⁹ ≈ 2.0e-3 for bf16 (8 significant bits), 2⁻¹² ≈ 2.4e-4 for f16
// (11 bits). Every weight and every GEMM input is rounded once (relative error ≤ u, u/2 on
// average, random signs), the products accumulate in f32, everything else is f32: so each
// gradient should be off by O(u) of its norm. The loss moves much less: the logits of a freshly
// initialised model are small (|z| ≲ 0.3), so their rounding errors, ≈ u·|z|, barely move a
// loss near ln 65 ≈ 4.17, and they average out over 256 tokens. Measured (2 threads): gradients
// bf16 3.9e-3 (gpt2) / 3.0e-3 (llama) of their norm, worst single tensor 7.9e-3, loss 4.8e-6;
// f16 4.1e-4 / 3.5e-4, worst 9.4e-4, loss 1.3e-6 — the gradients at ≈ 1.5–4 u. The bounds
// allow 5 u overall and 10–16 u per tensor, the loss ≈ 40× and 20× what was measured. Losing
// the biases in the 16-bit forward fails them (gradients 5e-2, one tensor 0.8), and so does
// overwriting instead of accumulating the weight gradients (gradients 0.4–0.8).
constexpr Tolerances kBf16{.loss = 2e-4, .grads = 1e-2, .per_grad = 2e-2};
// f16's narrow range is what the loss scale of 1024 covers, as the dynamic loss scaler does
// (Micikevicius et al. 2018, §3.2): unscaled, dlogits ≈ 1/(tokens·V) ≈ 1e-4 and below sit
// among f16's subnormals, with few significant bits.
constexpr Tolerances kF16{.loss = 3e-5, .grads = 1.2e-3, .per_grad = 4e-3};
constexpr float kF16LossScale = 1024.0f;

TEST(MixedPrecisionModel, Gpt2Bf16MatchesF32) {
  expect_close_to_f32(ModelFamily::gpt2, DType::bf16, 1.0f, kBf16);
}
TEST(MixedPrecisionModel, LlamaBf16MatchesF32) {
  expect_close_to_f32(ModelFamily::llama, DType::bf16, 1.0f, kBf16);
}
TEST(MixedPrecisionModel, Gpt2F16MatchesF32) {
  expect_close_to_f32(ModelFamily::gpt2, DType::f16, kF16LossScale, kF16);
}
TEST(MixedPrecisionModel, LlamaF16MatchesF32) {
  expect_close_to_f32(ModelFamily::llama, DType::f16, kF16LossScale, kF16);
}

}  // namespace
}  // namespace meshtrain
