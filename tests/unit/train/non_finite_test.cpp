// tests/unit/train/non_finite_test.cpp
//
// The pieces of the non-finite origin report (issue 17 item 8; docs/resilience.md):
// kernels::all_finite (the vectorised check of gradients before their reduction) against
// std::isfinite at every position and for every kind of special value, the watch's note (first
// element, offset, reduction named; later checks change nothing) and layer_of.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/non_finite_grads.h"
#include "meshtrain/train/non_finite_report.h"

namespace meshtrain {
namespace {

TEST(AllFinite, FindsEverySpecialValueAtEveryPosition) {
  using limits = std::numeric_limits<float>;
  const std::vector<float> bad = {limits::quiet_NaN(), -limits::quiet_NaN(),
                                  limits::signaling_NaN(), limits::infinity(), -limits::infinity()};
  // Finite edge cases must pass: the largest, the smallest normal, a denormal, −0.
  std::vector<float> x(67);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 30.0f;
  x[3] = limits::max();
  x[4] = -limits::max();
  x[5] = limits::min();
  x[6] = limits::denorm_min();
  x[7] = -0.0f;
  EXPECT_TRUE(kernels::all_finite(x.data(), static_cast<std::int64_t>(x.size())));
  EXPECT_TRUE(kernels::all_finite(x.data(), 0));
  for (const float b : bad) {
    for (std::size_t i = 0; i < x.size(); ++i) {  // vector body and scalar tail
      std::vector<float> y = x;
      y[i] = b;
      EXPECT_FALSE(kernels::all_finite(y.data(), static_cast<std::int64_t>(y.size())))
          << b << " at " << i;
    }
  }
}

TEST(NonFiniteGradWatch, NotesTheFirstElementOfTheFirstCheckOnly) {
  const auto world = single_rank_group("dp");
  Parameter a("transformer.h.2.attn.c_proj.weight", Shape{4, 4}, InitKind::zeros);
  Parameter b("transformer.h.3.mlp.c_fc.weight", Shape{4, 4}, InitKind::zeros);
  std::vector<float> g(8, 1.0f);
  NonFiniteGradWatch watch;
  watch.check(a, g, 8, GradReduction::replicas, "all-reduce", *world);
  EXPECT_FALSE(watch.first());
  g[5] = std::numeric_limits<float>::infinity();
  g[6] = std::numeric_limits<float>::quiet_NaN();
  watch.check(a, g, 8, GradReduction::replicas, "reduce-scatter", *world);
  watch.check(b, g, 0, GradReduction::tied_embedding, "sum of the tied embedding's copies", *world);
  ASSERT_TRUE(watch.first());
  EXPECT_EQ(watch.first()->param, &a);
  EXPECT_EQ(watch.first()->element, 13);  // offset 8 + index 5
  EXPECT_EQ(watch.first()->value, std::numeric_limits<float>::infinity());
  EXPECT_EQ(watch.first()->before, "the reduce-scatter over " + world->name());
  watch.clear();
  EXPECT_FALSE(watch.first());
}

TEST(LayerOf, NamesTheBlockOrTheModule) {
  EXPECT_EQ(layer_of("transformer.h.11.mlp.c_fc.weight"), "layer 11");
  EXPECT_EQ(layer_of("model.layers.3.block_sparse_moe.experts.7.w1.weight"), "layer 3");
  EXPECT_EQ(layer_of("transformer.wte.weight"), "module transformer.wte");
  EXPECT_EQ(layer_of("lm_head.weight"), "module lm_head");
  EXPECT_EQ(layer_of("model.norm.weight"), "module model.norm");
}

}  // namespace
}  // namespace meshtrain
