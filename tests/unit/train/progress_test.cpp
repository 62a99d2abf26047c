// The log line's ETA and the end-of-run summary (train/progress.h) on hand-made step times:
// the documented formula (recent steps' mean × steps left + mean evaluation × evaluations
// left), which steps evaluate, the 20-step window, H:MM:SS, and the summary's run totals.
#include "meshtrain/train/progress.h"

#include <gtest/gtest.h>

namespace meshtrain {
namespace {

StepMetrics step(std::int64_t n, double step_time_s, std::optional<double> val = std::nullopt,
                 double checkpoint_s = 0.0, double mfu = 0.0) {
  StepMetrics m;
  m.step = n;
  m.step_time_s = step_time_s;
  m.val_loss = val;
  m.checkpoint_s = checkpoint_s;
  m.mfu = mfu;
  return m;
}

TEST(Progress, EvaluationsLeft) {
  const EtaEstimator every4(10, 4);  // evaluates at 4, 8 and the last step, 10
  EXPECT_EQ(every4.evaluations_after(0), 3);
  EXPECT_EQ(every4.evaluations_after(4), 2);
  EXPECT_EQ(every4.evaluations_after(8), 1);
  EXPECT_EQ(every4.evaluations_after(9), 1);
  EXPECT_EQ(every4.evaluations_after(10), 0);
  const EtaEstimator every5(10, 5);  // 5 and 10: the last step is a multiple
  EXPECT_EQ(every5.evaluations_after(0), 2);
  EXPECT_EQ(every5.evaluations_after(5), 1);
  const EtaEstimator last_only(10, 0);
  EXPECT_EQ(last_only.evaluations_after(3), 1);
  EXPECT_EQ(last_only.evaluations_after(10), 0);
}

TEST(Progress, EtaCountsStepsAndEvaluationsLeft) {
  EtaEstimator eta(10, 4);
  EXPECT_EQ(eta.eta_s(), 0.0);  // nothing measured yet
  for (int i = 1; i <= 3; ++i) eta.add(step(i, 0.9), 1.0);
  EXPECT_DOUBLE_EQ(eta.eta_s(), 7 * 1.0);  // the evaluation's cost is not known yet
  // Step 4 evaluates: 3 s wall = 0.9 training + 0.1 checkpoint + 2 evaluation.
  eta.add(step(4, 0.9, 3.0, 0.1), 3.0);
  EXPECT_DOUBLE_EQ(eta.eta_s(), 6 * 1.0 + 2 * 2.0);  // steps 5–10, evaluations at 8 and 10
  for (int i = 5; i <= 9; ++i) eta.add(step(i, 0.9), 1.0);
  EXPECT_DOUBLE_EQ(eta.eta_s(), 1 * 1.0 + 1 * 2.0);
  eta.add(step(10, 0.9, 2.0), 3.0);
  EXPECT_EQ(eta.eta_s(), 0.0);  // the run is over
}

TEST(Progress, EtaAveragesTheLast20Steps) {
  EtaEstimator eta(100, 0);
  for (int i = 1; i <= 25; ++i) eta.add(step(i, 0.5), static_cast<double>(i));
  EXPECT_DOUBLE_EQ(eta.eta_s(), (6.0 + 25.0) / 2.0 * 75);  // steps 6–25, 75 left
}

TEST(Progress, Duration) {
  EXPECT_EQ(format_duration(0.0), "0:00:00");
  EXPECT_EQ(format_duration(59.6), "0:01:00");
  EXPECT_EQ(format_duration(3725.4), "1:02:05");
  EXPECT_EQ(format_duration(90000.0), "25:00:00");
  EXPECT_EQ(format_duration(-1.0), "0:00:00");
}

TEST(Progress, SummaryTotals) {
  RunSummary s;
  s.add(step(11, 1.0, std::nullopt, 0.0, 0.1), 512, 1.5);
  s.add(step(12, 2.0, 3.0, 0.0, 0.4), 512, 4.0);
  s.add(step(13, 1.0, 2.5, 0.0, 0.1), 512, 6.0);
  s.peak_bytes = 3 * 1048576;
  s.peak_rank = 1;
  EXPECT_EQ(s.steps, 3);
  EXPECT_EQ(s.tokens, 1536);
  EXPECT_DOUBLE_EQ(s.tokens_per_s(), 1536.0 / 4.0);  // over the steps' time, not the wall
  EXPECT_DOUBLE_EQ(s.mfu(), (0.1 * 1 + 0.4 * 2 + 0.1 * 1) / 4.0);  // time-weighted
  ASSERT_TRUE(s.best_val_loss);
  EXPECT_EQ(*s.best_val_loss, 2.5);
  EXPECT_EQ(s.best_val_step, 13);
  EXPECT_EQ(s.format(),
            "summary: 3 steps (11–13) | 1536 tokens | wall 0:00:06 (6.000 s) | 384.0 tokens/s "
            "(256.0 over the wall time) | MFU 25.000% | best val_loss 2.500000 at step 13 | peak "
            "memory 3.0 MiB (3145728 bytes, rank 1)");
}

}  // namespace
}  // namespace meshtrain
