// Issue 7, item 4(b): the planner against published runs — the ten weak-scaling runs of
// Narayanan et al. 2021 (Megatron-LM, Table 1) reproduced by account() on 8×A100-80GB nodes
// after one efficiency calibration (on the 145.6B row), within 10 %; and seed 002's worked
// 13B examples through the planner's own formula functions. docs/planner.md, "Published runs".
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/plan/formulas.h"
#include "meshtrain/plan/published_runs.h"

namespace meshtrain::plan {
namespace {

// The target is 10–15 % after one calibration; every row is within 5.3 % today, so the
// test holds the stricter end.
constexpr double kTolerance = 0.10;

TEST(PlanPublished, TableOneIsConsistentAsTranscribed) {
  const auto& rows = narayanan2021_table1();
  ASSERT_EQ(rows.size(), 10u);
  for (const PublishedRun& r : rows) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(r.gpus % (r.tp * r.pp), 0);
    const std::int64_t dp = r.gpus / (r.tp * r.pp);
    EXPECT_EQ(r.global_batch % dp, 0);
    // Aggregate = GPUs × per-GPU, and % of peak = per-GPU / 312, to the table's rounding.
    EXPECT_NEAR(r.aggregate_pflops, static_cast<double>(r.gpus) * r.tflops_per_gpu / 1000.0,
                0.01 * r.aggregate_pflops);
    EXPECT_NEAR(r.percent_of_peak, 100.0 * r.tflops_per_gpu / 312.0, 0.6);
    // The parameter count, Eq. 2: 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), to the table's 0.1B.
    const double l = static_cast<double>(r.layers), h = static_cast<double>(r.hidden);
    const double params =
        12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (51200.0 + 2048.0) / (12.0 * l * h));
    EXPECT_NEAR(params / 1e9, r.billions, 0.06 + 0.002 * r.billions);
  }
}

TEST(PlanPublished, PlannerHardwareFlopsEqualEquationThree) {
  // The paper's teraFLOP/s count Eq. 3's FLOPs (with the recomputed forward); the planner's
  // hardware FLOPs per token under full recompute count exactly the same terms.
  for (const PublishedRun& r : narayanan2021_table1()) {
    const ModelConfig m = published_model(r);
    const ModelSize size = model_size(m);
    const double planner =
        hardware_flops_per_token(size.matmul_parameters, size.block_matmul_parameters, m.n_layer,
                                 m.n_embd, m.block_size, RecomputeMode::full) *
        static_cast<double>(r.global_batch) * static_cast<double>(m.block_size);
    const double paper =
        narayanan_flops_per_iteration(r.global_batch, 2048, r.layers, r.hidden, 51200);
    EXPECT_NEAR(planner / paper, 1.0, 1e-12) << r.name;
  }
}

TEST(PlanPublished, ThroughputOfEveryRunWithinToleranceAfterOneCalibration) {
  const std::vector<PublishedCheck> checks = check_published_runs();
  ASSERT_EQ(checks.size(), 10u);
  for (const PublishedCheck& c : checks) {
    SCOPED_TRACE(c.run.name);
    // The published layout is one the trainer's rules accept.
    EXPECT_TRUE(
        check_layout(published_model(c.run), published_layout(c.run), published_settings(c.run))
            .empty());
    EXPECT_LE(std::abs(c.error), kTolerance)
        << "published " << c.run.tflops_per_gpu << " TFLOP/s per GPU, predicted "
        << c.predicted_tflops << "\n"
        << format_published_table(checks);
    if (std::string(c.run.name) == kCalibrationRun) {
      EXPECT_NEAR(c.error, 0.0, 1e-6);
    }
  }
  // The calibrated efficiency (docs/planner.md): 0.580 of the 312 TFLOP/s peak for the GEMMs.
  const double efficiency = calibrate_efficiency(narayanan2021_table1()[6], megatron_2021_time());
  EXPECT_NEAR(efficiency, 0.580, 0.005);
  // The headline: the 1T model at 52 % of peak (163 TFLOP/s per GPU, 502 PFLOP/s on 3072 GPUs).
  const PublishedCheck& one_t = checks.back();
  EXPECT_NEAR(one_t.predicted_tflops * 3072.0 / 1000.0, 502.0, kTolerance * 502.0);
}

TEST(PlanPublished, SeedThirteenBillionExamplesThroughThePlannersFormulas) {
  // Seed 002: 13B in fp16 → 26 GB of weights; fp32 master + Adam m and v (12 B/param) ≈ 156 GB.
  Config c;
  c.training.precision = Precision::fp16;
  const MemoryBreakdown state = model_state_bytes(c, 13e9);
  EXPECT_DOUBLE_EQ(state.params, 26e9);
  EXPECT_DOUBLE_EQ(state.optimizer, 156e9);
  // Its fp16 gradients (26 GB) all-reduced over 32 GPUs: 2·31/32·26 GB ≈ 50 GB leave each GPU,
  // ≈ 5 s at 10 GB/s.
  EXPECT_DOUBLE_EQ(all_reduce_wire_bytes(26e9, 32), 50.375e9);
  EXPECT_DOUBLE_EQ(all_reduce_s(26e9, 32, 10e9, 0.0), 5.0375);
  EXPECT_NEAR(all_reduce_wire_bytes(26e9, 32) / 1e9, 50.0, 0.5);
}

TEST(PlanPublished, FullRecomputeRepeatsTheForwardTpCollectives) {
  // TransformerBlock::backward reruns the forward, its two tp all-reduces per layer included
  // (the dist test TpLayout.BytesPerStepWithFullRecomputeEqualTheFormula counts them): 6L + 2
  // tensors per micro-batch instead of 4L + 2.
  const PublishedRun& r = narayanan2021_table1()[3];  // 18.4B, t = 8, p = 1
  Config full = to_config(published_model(r), published_layout(r), published_settings(r));
  Config none = full;
  none.training.recompute = RecomputeMode::none;
  const ParameterCounts sp = stage_parameters(full, 0);
  EXPECT_EQ(tp_tensors_per_micro_batch(full, sp), 6.0 * 40 + 2);
  EXPECT_EQ(tp_tensors_per_micro_batch(none, sp), 4.0 * 40 + 2);
  const double D = 2048.0 * 6144.0 * 4.0;
  EXPECT_DOUBLE_EQ(tp_bytes_per_step(full, sp) - tp_bytes_per_step(none, sp),
                   static_cast<double>(full.training.accumulation) * 2.0 * 40.0 * D);
}

}  // namespace
}  // namespace meshtrain::plan
