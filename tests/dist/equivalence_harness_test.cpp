// The equivalence harness can fail: a run compared with itself passes, and a copy with one
// gradient, one step's loss or the grad norm moved by ten times its tolerance is reported,
// naming what moved. Every rank runs it on a one-rank group, at every world size.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <string>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "equivalence_harness.h"

namespace meshtrain {
namespace {

constexpr test::Tolerances kTolerances{1e-5, 1e-6, 1e-5};

test::TrainedRun copy_of(const test::TrainedRun& run) {
  test::TrainedRun copy;
  copy.losses = run.losses;
  copy.grad_norm_step1 = run.grad_norm_step1;
  for (const Tensor& g : run.grads_step1) copy.grads_step1.push_back(g.clone(MemCategory::other));
  return copy;
}

TEST(EquivalenceHarness, ReportsAMovedGradientLossOrGradNorm) {
  const auto self = test::runtime().self_group();
  Trainer trainer(test::small_config(1, 2, 1), *self, test::quiet());
  const test::TrainedRun want = test::train_steps(trainer, 3);
  const ParameterList& params = trainer.parameters();
  test::expect_equivalent(want, params, copy_of(want), params, kTolerances);

  // The last parameter's gradient, scaled as a wrong 1/dp or a lost micro-batch would.
  test::TrainedRun got = copy_of(want);
  Tensor& g = got.grads_step1.back();
  for (std::int64_t i = 0; i < g.numel(); ++i) g.f32()[i] *= 1.0f + 1e-4f;
  EXPECT_NONFATAL_FAILURE(test::expect_equivalent(want, params, got, params, kTolerances),
                          params.back()->name);

  got = copy_of(want);
  got.losses[1] *= 1.0 + 1e-4;
  EXPECT_NONFATAL_FAILURE(test::expect_equivalent(want, params, got, params, kTolerances),
                          "step 2");

  got = copy_of(want);
  got.grad_norm_step1 *= 1.0 + 1e-5;
  EXPECT_NONFATAL_FAILURE(test::expect_equivalent(want, params, got, params, kTolerances),
                          "grad norm");
}

}  // namespace
}  // namespace meshtrain
