// Peak live activations per pipeline stage follow the schedule (issue 4): measured with the
// tracked allocator's activation peak over one optimizer step, GPipe's grows by one
// micro-batch's activations per micro-batch, while 1F1B's stops growing once stage s holds
// pp − s micro-batches (Narayanan et al. 2021, §2.2: at most pp − s in flight).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "meshtrain/core/allocator.h"

namespace meshtrain {
namespace {

// Activation bytes above the level before the step, at the step's peak, on this rank.
std::int64_t peak_step_activations(PipelineSchedule schedule, std::int64_t m) {
  const auto world = test::runtime().world_group();
  Config c = test::small_tp_config(ModelFamily::gpt2, 1, 1, false, 2, m);
  c.parallel.pp = world->size();
  c.model.n_layer = 2 * world->size();
  c.parallel.pp_schedule = schedule;
  Trainer trainer(c, *world, test::quiet());
  trainer.compute_gradients(0);  // fills the allocator's cache; step 2 is the steady state
  trainer.apply_update(0, 1.0);
  TrackedAllocator& alloc = TrackedAllocator::instance();
  alloc.reset_peaks();
  const std::int64_t before = alloc.stats(MemCategory::activations).current_bytes;
  trainer.compute_gradients(1);
  return alloc.stats(MemCategory::activations).peak_bytes - before;
}

// One activation between stages, [micro_batch·T, C] f32 = 2·32·32·4 bytes here. A receive
// posted ahead or a send not yet completed holds one such buffer for a while; whether it is
// alive at the peak depends on timing, so the comparisons below allow two of them (a
// micro-batch's activations are > 10 of them, which is what the schedule changes).
constexpr std::int64_t kBoundaryBytes = 2 * 32 * 32 * 4;
constexpr std::int64_t kSlack = 2 * kBoundaryBytes;

// pp = the world: instantiated only at np ≥ 2 (one rank has no pipeline).
class PipelineMemory : public ::testing::TestWithParam<int> {};

TEST_P(PipelineMemory, OneFOneBKeepsAtMostPpMinusStageMicroBatchesAliveGPipeAll) {
  const auto world = test::runtime().world_group();
  const int pp = world->size(), stage = world->rank();
  ASSERT_EQ(pp, GetParam());
  const int in_flight = pp - stage;                    // 1F1B's bound on this stage
  std::vector<std::int64_t> gpipe{0}, one_f_one_b{0};  // index m = micro-batches
  for (std::int64_t m = 1; m <= pp + 2; ++m) {
    gpipe.push_back(peak_step_activations(PipelineSchedule::gpipe, m));
    one_f_one_b.push_back(peak_step_activations(PipelineSchedule::one_f_one_b, m));
  }
  // GPipe keeps every micro-batch: the peak grows by the same amount per micro-batch.
  const std::int64_t per_microbatch = gpipe[3] - gpipe[2];
  EXPECT_GT(per_microbatch, 10 * kBoundaryBytes);
  for (int m = 3; m <= pp + 2; ++m) {
    EXPECT_LE(std::abs(gpipe[m] - gpipe[m - 1] - per_microbatch), kSlack) << "m = " << m;
  }
  // 1F1B: no more than GPipe with pp − stage micro-batches (plus the posted receive), and flat
  // from there on whatever m.
  for (int m = 1; m <= pp + 2; ++m) {
    EXPECT_LE(one_f_one_b[m], gpipe[std::min(m, in_flight)] + kSlack) << "m = " << m;
  }
  for (int m = in_flight + 2; m <= pp + 2; ++m) {
    EXPECT_LE(std::abs(one_f_one_b[m] - one_f_one_b[in_flight + 1]), kSlack) << "m = " << m;
  }
  EXPECT_LT(one_f_one_b[pp + 2] + per_microbatch, gpipe[pp + 2]);
}

INSTANTIATE_TEST_SUITE_P(World, PipelineMemory, ::testing::ValuesIn(test::world_of_at_least(2)),
                         test::world_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PipelineMemory);

// Evaluation is forward only: every micro-batch's activations are dropped right after its
// forward (CausalLm::discard), so evaluate() leaves nothing behind and never holds two
// micro-batches' activations at once.
TEST(EvaluationMemory, EvaluateKeepsNoActivations) {
  const auto world = test::runtime().world_group();
  Config c = test::small_tp_config(ModelFamily::gpt2, 1, 1, false, 2, 3);
  c.parallel.pp = world->size();
  c.model.n_layer = 2 * world->size();
  Trainer trainer(c, *world, test::quiet());
  TrackedAllocator& alloc = TrackedAllocator::instance();
  const std::int64_t before = alloc.stats(MemCategory::activations).current_bytes;
  trainer.evaluate();
  EXPECT_EQ(alloc.stats(MemCategory::activations).current_bytes, before);
}

}  // namespace
}  // namespace meshtrain
