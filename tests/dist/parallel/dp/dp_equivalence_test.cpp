// DESIGN invariants 1–3 for data parallelism: dp = N (world size) equals dp = 1 at the same
// global batch. The reference runs on every rank over a one-rank group, with no communication,
// so a mismatch is in the data-parallel code. Compares losses of 20 steps, every gradient and
// the grad norm after step 1 (Adam hides a wrong gradient scale in the loss curve), and the
// initial weights bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "equivalence_harness.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

using test::quiet;
using test::TrainedRun;

// fp32: the dp all-reduce sums N partial means instead of one mean over all tokens, a
// re-association worth a few ulp (≈1e-7 relative); 1e-6 gradients and 1e-5 over 20 Adam steps
// (which amplify differences of near-zero second moments) leave headroom, and any wrong factor
// of dp or a missing micro-batch is off by ≥ 1e-2.
constexpr double kGradRtol = 1e-6;
constexpr double kLossRtol = 1e-5;
constexpr test::Tolerances kTolerances{kGradRtol, kGradRtol, kLossRtol};

// Trains dp = world size and dp = 1 and compares them (invariants 1–3). Called with the
// gradient buckets in shared-memory windows (mpirun's ranks share this node) and by messages.
void expect_matches_single_process() {
  MpiRuntime& rt = test::runtime();
  const int dp = rt.world_size();
  constexpr std::int64_t kGlobalBatch = 8;
  ASSERT_EQ(kGlobalBatch % dp, 0);

  test::Equivalence runs(test::small_config(1, kGlobalBatch, 1),
                        test::small_config(dp, kGlobalBatch / dp, 1));

  // Invariant 1: the same initial weights, bit for bit, as the dp = 1 run and as rank 0.
  ASSERT_NO_FATAL_FAILURE(runs.expect_same_initial_weights());
  const auto world = rt.world_group();
  for (const Parameter* p : runs.parallel().parameters()) {
    Tensor from_rank0 = p->value.clone(MemCategory::other);
    world->broadcast(std::as_writable_bytes(from_rank0.span_f32()), 0);
    ASSERT_EQ(std::memcmp(from_rank0.f32(), p->value.f32(),
                          static_cast<std::size_t>(from_rank0.bytes())),
              0)
        << p->name << " differs from rank 0";
  }

  runs.train(20);
  runs.expect_equivalent(kTolerances);
}

TEST(DataParallel, MatchesSingleProcessAtSameGlobalBatch) { expect_matches_single_process(); }

// MESHTRAIN_SHM_ALL_REDUCE=0: the buckets go by MPI_Iallreduce, and the mean's 1/dp is the
// request's pass after the sum (ProcessGroup::iall_reduce_sum's scale), not the window's.
TEST(DataParallel, MatchesSingleProcessWithTheAllReduceByMessages) {
  ::setenv("MESHTRAIN_SHM_ALL_REDUCE", "0", 1);
  expect_matches_single_process();
  ::unsetenv("MESHTRAIN_SHM_ALL_REDUCE");
}

TEST(DataParallel, AccumulationEqualsOneLargerMicroBatch) {
  MpiRuntime& rt = test::runtime();
  const int dp = rt.world_size();
  const auto world = rt.world_group();
  // Accumulation 4 × micro-batch 2 against 1 × micro-batch 8, both at dp = world size.
  Trainer large(test::small_config(dp, 8, 1), *world, quiet());
  Trainer accumulated(test::small_config(dp, 2, 4), *world, quiet());
  const TrainedRun a = test::train_steps(large, 20);
  const TrainedRun b = test::train_steps(accumulated, 20);
  test::expect_equivalent(a, large.parameters(), b, accumulated.parameters(), kTolerances);
}

TEST(DataParallel, OneGradientAllReducePerStepOfExactlyTheGradientBytes) {
  MpiRuntime& rt = test::runtime();
  const int dp = rt.world_size();
  const auto world = rt.world_group();
  Trainer trainer(test::small_config(dp, 2, 4), *world, quiet());
  std::int64_t grad_bytes = 0;
  for (const Parameter* p : trainer.parameters()) grad_bytes += p->grad.bytes();
  ProcessGroup& dp_group = trainer.mesh().group(Axis::dp);
  dp_group.reset_counters();
  trainer.compute_gradients(0);
  // Bucketed gradient all-reduce plus the 8-byte loss; with 4 micro-batches still one
  // reduction of the gradients (buckets ≤ 4 MiB hold this whole model in one message).
  if (dp > 1) {
    EXPECT_EQ(dp_group.counter(CommOp::all_reduce).bytes, grad_bytes + 8);
    EXPECT_EQ(dp_group.counter(CommOp::all_reduce).calls, 2);
  } else {
    EXPECT_EQ(dp_group.counter(CommOp::all_reduce).calls, 0);
  }
}

}  // namespace
}  // namespace meshtrain
