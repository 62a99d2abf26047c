// A routing collapse (issue 14, "what users watch" and "bad input"): with the router's weights
// set to zero every token's logits tie, and the router picks the lowest experts (ties to the
// lower index), so all N·k assignments go to experts 0 and 1 of 8. Under expert parallel (dp 2
// × ep 2, np 2; one process at np 1) training goes on — dropless every assignment is computed,
// with a capacity factor of 1.0 each of the two experts keeps ⌈N·k/E⌉ = N·k/8 of its N
// assignments — never hangs, and the metrics alone show it: imbalance (max/mean) = E/k = 4,
// dropped fraction 0 or 1 − 2·(1/8) = 0.75, all tokens on experts 0 and 1.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "meshtrain/train/moe_metrics.h"

namespace meshtrain {
namespace {

class MoeCollapse : public ::testing::TestWithParam<double> {};

TEST_P(MoeCollapse, TrainsAndTheMetricsShowIt) {
  const double capacity = GetParam();
  const auto world = test::runtime().world_group();
  const std::int64_t dp = world->size();
  Config c = test::small_tp_config(ModelFamily::llama, dp, 1, false, 4 / dp, 1);
  c.model.moe_experts = 8;
  c.model.moe_top_k = 2;
  c.model.moe_ffn_hidden = 16;
  c.model.moe_capacity_factor = capacity;
  c.model.moe_aux_loss_coeff = 0.01;
  c.parallel.ep = dp;
  Trainer trainer(c, *world, test::quiet());
  for (OptimizerShard& s : trainer.zero().shards()) {
    if (s.param->name.find("block_sparse_moe.gate") == std::string::npos) continue;
    for (std::int64_t i = 0; i < s.master.numel(); ++i) s.master.f32()[i] = 0.0f;
  }
  trainer.zero().publish_parameters();

  const Trainer::Gradients g = trainer.compute_gradients(0);
  EXPECT_TRUE(std::isfinite(g.loss) && std::isfinite(g.grad_norm));
  trainer.apply_update(0, g.grad_norm);
  // What Trainer::train_step reports in the metrics line (train/moe_metrics.h).
  const std::vector<MoeLayerMetrics> moe =
      collect_moe_metrics(trainer.stage(), trainer.mesh(), c.model, false);
  ASSERT_EQ(moe.size(), 2u);                                    // both blocks are MoE
  const std::int64_t assignments = 4 * c.model.block_size * 2;  // global batch · T · k
  for (const MoeLayerMetrics& l : moe) {
    EXPECT_DOUBLE_EQ(l.imbalance, 4.0) << "layer " << l.layer;
    EXPECT_EQ(l.routed_per_expert[0], assignments / 2);
    EXPECT_EQ(l.routed_per_expert[1], assignments / 2);
    for (int e = 2; e < 8; ++e) EXPECT_EQ(l.routed_per_expert[e], 0);
    EXPECT_DOUBLE_EQ(l.dropped_fraction, capacity == 0.0 ? 0.0 : 0.75) << "layer " << l.layer;
    // Zero router weights give uniform probabilities Pᵢ = 1/E, so E·Σ fᵢPᵢ = 1 whatever the
    // counts: the loss's value is coeff; its gradient (∝ fᵢ) is what pushes the router away.
    EXPECT_NEAR(l.aux_loss, 0.01, 1e-9) << "layer " << l.layer;
  }
  // And the next step trains (the experts that got no rows have zero gradients, not NaN).
  const Trainer::Gradients next = trainer.compute_gradients(1);
  EXPECT_TRUE(std::isfinite(next.loss) && std::isfinite(next.grad_norm));
}

std::vector<double> capacities_of_this_world() {
  const int world = test::launched_world_size();
  if (world != 1 && world != 2) return {};
  return {0.0, 1.0};
}

INSTANTIATE_TEST_SUITE_P(Capacity, MoeCollapse, ::testing::ValuesIn(capacities_of_this_world()),
                         [](const ::testing::TestParamInfo<double>& p) {
                           return p.param == 0.0 ? std::string("dropless")
                                                 : std::string("capacity1");
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MoeCollapse);

}  // namespace
}  // namespace meshtrain
