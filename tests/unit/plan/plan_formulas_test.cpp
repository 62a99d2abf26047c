// The planner's formulas (plan/formulas.h) against hand-computed values: seed 002's worked
// example, the ring collectives, the pipeline bubbles of docs/pipeline_parallel.md and the FLOPs
// per token of docs/performance.md's main job.
#include <gtest/gtest.h>

#include <stdexcept>

#include "meshtrain/plan/formulas.h"

namespace meshtrain::plan {
namespace {

TEST(PlanFormulas, SeedThirteenBillionGradientsOverThirtyTwoGpus) {
  // Seed 002: 13B fp16 gradients = 26 GB; a ring all-reduce over 32 GPUs moves
  // 2·(31/32)·26 GB ≈ 50 GB per GPU, ≈ 5 s at 10 GB/s.
  const double gradients = 2.0 * 13e9;
  EXPECT_DOUBLE_EQ(all_reduce_wire_bytes(gradients, 32), 2.0 * 31.0 / 32.0 * 26e9);
  EXPECT_NEAR(all_reduce_wire_bytes(gradients, 32), 50e9, 0.5e9);
  EXPECT_DOUBLE_EQ(all_reduce_s(gradients, 32, 10e9, 0.0), 50.375e9 / 10e9);
  EXPECT_NEAR(all_reduce_s(gradients, 32, 10e9, 0.0), 5.0, 0.05);
}

TEST(PlanFormulas, RingCollectivesIncludingLatency) {
  // 8 ranks, 1 GB, 100 GB/s, 10 µs: all-reduce 2·7/8·0.01 s + 14·10 µs.
  EXPECT_DOUBLE_EQ(all_reduce_s(1e9, 8, 100e9, 10e-6), 2.0 * 7.0 / 8.0 * 0.01 + 14 * 10e-6);
  EXPECT_DOUBLE_EQ(reduce_scatter_s(1e9, 8, 100e9, 10e-6), 7.0 / 8.0 * 0.01 + 7 * 10e-6);
  EXPECT_DOUBLE_EQ(all_gather_s(1e9, 8, 100e9, 10e-6), 7.0 / 8.0 * 0.01 + 7 * 10e-6);
  EXPECT_DOUBLE_EQ(all_to_all_s(1e9, 8, 100e9, 10e-6), 7.0 / 8.0 * 0.01 + 7 * 10e-6);
  EXPECT_DOUBLE_EQ(p2p_s(1e9, 100e9, 10e-6), 0.01 + 10e-6);
  // An all-reduce is a reduce-scatter followed by an all-gather (Patarasuk & Yuan 2009).
  EXPECT_DOUBLE_EQ(all_reduce_s(3e8, 5, 25e9, 8e-6),
                   reduce_scatter_s(3e8, 5, 25e9, 8e-6) + all_gather_s(3e8, 5, 25e9, 8e-6));
  EXPECT_EQ(all_reduce_s(1e9, 1, 100e9, 10e-6), 0.0);
  EXPECT_EQ(all_reduce_wire_bytes(1e9, 1), 0.0);
}

TEST(PlanFormulas, PipelineBubblePerSchedule) {
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::one_f_one_b, 4, 8, 1), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::gpipe, 4, 8, 1), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::interleaved_1f1b, 4, 8, 2), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::zb_h1, 4, 8, 1), 3.0 / 27.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::one_f_one_b, 1, 8, 1), 0.0);
  // A deep pipeline: p = 64 stages, m = 48 micro-batches.
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::one_f_one_b, 64, 48, 1), 63.0 / 111.0);
  // An unknown schedule name is a config error when loaded (config_test, BadEnumNames...).
  EXPECT_EQ(bubble_formula(PipelineSchedule::interleaved_1f1b), "(p−1)/(v·m+p−1)");
}

TEST(PlanFormulas, MicroBatchesInFlightPerStage) {
  EXPECT_EQ(in_flight_micro_batches(PipelineSchedule::one_f_one_b, 4, 0, 8, 1), 4.0);
  EXPECT_EQ(in_flight_micro_batches(PipelineSchedule::one_f_one_b, 4, 3, 8, 1), 1.0);
  EXPECT_EQ(in_flight_micro_batches(PipelineSchedule::one_f_one_b, 4, 0, 2, 1), 2.0);
  EXPECT_EQ(in_flight_micro_batches(PipelineSchedule::gpipe, 4, 2, 8, 1), 8.0);
  EXPECT_EQ(in_flight_micro_batches(PipelineSchedule::zb_h1, 4, 3, 8, 1), 4.0);
  // Interleaved, stage 0 of 4, v = 2: 2·3 + 1·4 + 1 = 11 chunk-micro-batches of half a stage.
  EXPECT_EQ(in_flight_micro_batches(PipelineSchedule::interleaved_1f1b, 4, 0, 8, 2), 5.5);
  EXPECT_EQ(in_flight_micro_batches(PipelineSchedule::one_f_one_b, 1, 0, 8, 1), 1.0);
}

TEST(PlanFormulas, FlopsPerTokenOfTheMainJob) {
  // docs/performance.md's 6·N + 12·L·C·T: the main job's matrix products are 4 blocks of
  // 4h² + 2h·4h = 196,608 and the tied head 65·128 = 8,320: Ψ_mm = 794,752.
  const double psi_mm = 4.0 * 196608.0 + 8320.0;
  EXPECT_DOUBLE_EQ(model_flops_per_token(psi_mm, 4, 128, 64), 6.0 * 794752.0 + 12.0 * 4 * 128 * 64);
  EXPECT_DOUBLE_EQ(hardware_flops_per_token(psi_mm, 786432.0, 4, 128, 64, RecomputeMode::none),
                   model_flops_per_token(psi_mm, 4, 128, 64));
  EXPECT_DOUBLE_EQ(hardware_flops_per_token(psi_mm, 786432.0, 4, 128, 64, RecomputeMode::selective),
                   model_flops_per_token(psi_mm, 4, 128, 64) + 4.0 * 4 * 128 * 64);
  // Full recompute: the blocks cost 4/3 of their forward + backward.
  const double blocks = 6.0 * 786432.0 + 12.0 * 4 * 128 * 64;
  EXPECT_DOUBLE_EQ(hardware_flops_per_token(psi_mm, 786432.0, 4, 128, 64, RecomputeMode::full) -
                       model_flops_per_token(psi_mm, 4, 128, 64),
                   blocks / 3.0);
}

}  // namespace
}  // namespace meshtrain::plan
