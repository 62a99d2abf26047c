// The fp16 loss scaler agreed by every rank (issue 5, seed 000 §3.3): an inf written into one
// rank's gradient at step k ([fault_injection] nonfinite_grad_*) makes every rank skip step k — the
// found-inf flag is a MAX over the world — and halve the scale identically; the weights do
// not move and stay bit-identical across dp replicas; after growth_interval clean steps the
// scale grows on every rank. Under ZeRO-1 too (each rank then only sees its own slices).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"

namespace meshtrain {
namespace {

// Every rank's copy of `t` equals rank 0's, bit for bit.
bool same_on_every_rank(ProcessGroup& world, const Tensor& t) {
  Tensor root = t.clone(MemCategory::other);
  world.broadcast(std::as_writable_bytes(root.span_f32()), 0);
  float differs = std::memcmp(root.f32(), t.f32(), static_cast<std::size_t>(t.bytes())) != 0;
  world.all_reduce_max(std::span<float>(&differs, 1));
  return differs == 0.0f;
}

class ScalerAgreement : public ::testing::TestWithParam<int> {};

TEST_P(ScalerAgreement, EveryRankSkipsTheOverflowingStepAndKeepsTheSameScale) {
  MpiRuntime& rt = test::runtime();
  const int dp = rt.world_size();
  Config c = test::small_config(dp, 2, 2);
  c.training.precision = Precision::fp16;
  c.training.loss_scale_init = 1024.0;
  c.training.loss_scale_growth_interval = 3;
  c.training.loss_scale_hysteresis = 1;
  c.parallel.zero_stage = GetParam();
  constexpr int kInfStep = 2;  // 0-based, as compute_gradients counts
  c.fault_injection.nonfinite_grad_step = kInfStep + 1;
  c.fault_injection.nonfinite_grad_rank = dp - 1;  // one rank only
  const auto world = rt.world_group();
  Trainer trainer(c, *world, test::quiet());
  const DynamicLossScaler& scaler = *trainer.loss_scaler();
  std::vector<Tensor> before;
  for (int s = 0; s < 7; ++s) {
    if (s == kInfStep) {
      for (const Parameter* p : trainer.parameters())
        before.push_back(trainer.zero().gather_master(*p));
    }
    const double scale = scaler.scale();
    const Trainer::Gradients g = trainer.compute_gradients(s);
    EXPECT_EQ(g.skipped, s == kInfStep) << "step " << s << " on rank " << rt.world_rank();
    trainer.apply_update(s, g.grad_norm);
    float mine = static_cast<float>(scaler.scale());
    float most = mine;
    world->all_reduce_max(std::span<float>(&most, 1));
    EXPECT_EQ(mine, most) << "ranks disagree on the scale after step " << s;
    if (s < kInfStep) {
      EXPECT_EQ(scaler.scale(), 1024.0);
    }
    if (s == kInfStep) {
      EXPECT_EQ(scaler.scale(), scale * 0.5) << "backoff 0.5 after one overflow (hysteresis 1)";
      const ParameterList& params = trainer.parameters();
      for (std::size_t i = 0; i < params.size(); ++i) {
        const Tensor now = trainer.zero().gather_master(*params[i]);
        EXPECT_EQ(std::memcmp(now.f32(), before[i].f32(), static_cast<std::size_t>(now.bytes())), 0)
            << params[i]->name << " moved in a skipped step";
      }
    }
    if (s == kInfStep + 3) {
      EXPECT_EQ(scaler.scale(), 1024.0) << "grows after 3 clean steps";
    }
  }
  EXPECT_EQ(scaler.skipped_steps(), 1);
  for (const Parameter* p : trainer.parameters()) {
    EXPECT_TRUE(same_on_every_rank(*world, trainer.zero().gather_master(*p))) << p->name;
  }
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, ScalerAgreement, ::testing::Values(0, 1));

// Issue 6, item 8: outside fp16 a NaN in one rank's gradient stops the run before the update,
// and the message every rank throws names that rank, the step and the parameter.
// ZeRO 0 too: there each dp rank sums the norm of its own gradient replica, so a value written
// into one replica after the reductions once sent that rank alone into the error path and the
// others on into the next collective (a hang the newcomer check found).
class NonFiniteGradient : public ::testing::TestWithParam<int> {};

TEST_P(NonFiniteGradient, IsReportedWithRankStepAndParameterOnEveryRank) {
  MpiRuntime& rt = test::runtime();
  const int world_size = rt.world_size();
  Config c = test::small_config(world_size, 2, 1);
  c.parallel.zero_stage = GetParam();
  c.fault_injection.nonfinite_grad_step = 3;
  c.fault_injection.nonfinite_grad_rank = world_size - 1;
  c.fault_injection.nonfinite_grad_value = FaultValue::nan;
  const auto world = rt.world_group();
  Trainer trainer(c, *world, test::quiet());
  // The fault is written into the rank's first non-empty optimizer shard.
  std::string culprit;
  for (const OptimizerShard& s : trainer.zero().shards()) {
    if (s.grad.numel() > 0) {
      culprit = s.param->name;
      break;
    }
  }
  std::int64_t length = static_cast<std::int64_t>(culprit.size());
  world->broadcast(std::as_writable_bytes(std::span<std::int64_t>(&length, 1)), world_size - 1);
  culprit.resize(static_cast<std::size_t>(length));
  world->broadcast(std::as_writable_bytes(std::span<char>(culprit)), world_size - 1);
  for (int s = 0; s < 2; ++s) {
    const Trainer::Gradients g = trainer.compute_gradients(s);
    trainer.apply_update(s, g.grad_norm);
  }
  const Tensor before = trainer.zero().shards().front().master.clone(MemCategory::other);
  try {
    trainer.compute_gradients(2);
    ADD_FAILURE() << "a NaN gradient passed";
  } catch (const TrainingDiverged& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("at step 3"), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("rank {}: {}", world_size - 1, culprit)), std::string::npos)
        << what;
  }
  const Tensor after = trainer.zero().shards().front().master;
  EXPECT_EQ(std::memcmp(before.f32(), after.f32(), static_cast<std::size_t>(after.bytes())), 0);
}

// ZeRO 1 shards over dp, so it needs 2 or more ranks.
INSTANTIATE_TEST_SUITE_P(ZeroStages, NonFiniteGradient,
                         ::testing::ValuesIn(test::launched_world_size() > 1
                                                 ? std::vector<int>{0, 1}
                                                 : std::vector<int>{0}));

}  // namespace
}  // namespace meshtrain
