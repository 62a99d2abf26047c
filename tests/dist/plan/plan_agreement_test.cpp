// The planner against meshtrain's own runtime (issue 7, item 4a): for small configs trained
// under mpirun, the planner's bytes per step per group (plan/accounting.h: dp, tp, pp, as
// ProcessGroup counts them) equal the byte counters of a real step exactly, on every rank, and
// its memory per category (params, grads, optimizer, activations, comm) is within 5 % of the
// tracked allocator's peaks on that rank.
//
// What the planner leaves out, and so what the 5 % must cover: the allocator's "other"
// category (data batches, loss scratch — not compared), the block rounding of the caching
// allocator, and for activations the transient buffers of the backward pass that
// docs/memory.md bounds rather than counts. Not asserted here: zb_h1's activation peak (its
// deferred weight-gradient inputs; the planner was 5.5 % under on pp 2 × tp 2 + sp, m 4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/plan/accounting.h"
#include "meshtrain/plan/context_parallel.h"

namespace meshtrain {
namespace {

struct AgreementCase {
  std::string name;
  ModelFamily family = ModelFamily::gpt2;
  std::int64_t dp = 1, tp = 1, pp = 1, v = 1, zero = 0, accumulation = 1;
  bool sp = false;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  RecomputeMode recompute = RecomputeMode::none;
  Precision precision = Precision::fp32;
  std::int64_t cp = 1, block = 32;
  CpCommMode cp_comm = CpCommMode::p2p;
};

void PrintTo(const AgreementCase& c, std::ostream* os) { *os << c.name; }

std::vector<AgreementCase> cases_of_this_world() {
  switch (test::launched_world_size()) {
    case 1:
      return {{.name = "single"},
              {.name = "single_selective", .recompute = RecomputeMode::selective},
              {.name = "single_full_llama",
               .family = ModelFamily::llama,
               .recompute = RecomputeMode::full},
              {.name = "single_bf16", .precision = Precision::bf16},
              {.name = "single_T4096", .block = 4096}};
    case 2:
      return {
          {.name = "dp2_zero0", .dp = 2},
          {.name = "dp2_zero1_m2", .dp = 2, .zero = 1, .accumulation = 2},
          {.name = "dp2_zero2_m2", .dp = 2, .zero = 2, .accumulation = 2},
          {.name = "dp2_zero3_m2", .dp = 2, .zero = 3, .accumulation = 2},
          {.name = "dp2_zero3_bf16", .dp = 2, .zero = 3, .precision = Precision::bf16},
          {.name = "tp2", .tp = 2},
          {.name = "tp2_sp_llama", .family = ModelFamily::llama, .tp = 2, .sp = true},
          {.name = "pp2_1f1b_m4", .pp = 2, .accumulation = 4},
          {.name = "pp2_gpipe_m2", .pp = 2, .accumulation = 2, .schedule = PipelineSchedule::gpipe},
          {.name = "pp2_interleaved_m4",
           .pp = 2,
           .v = 2,
           .accumulation = 4,
           .schedule = PipelineSchedule::interleaved_1f1b},
          // docs/memory.md "Context parallel": the activation peak per rank at T = 4096
          // falls as 1/cp (single_T4096 is cp = 1).
          {.name = "cp2_p2p_T4096", .cp = 2, .block = 4096},
          {.name = "cp2_a2a_T4096", .cp = 2, .block = 4096, .cp_comm = CpCommMode::a2a}};
    case 4:
      return {{.name = "tp2_dp2_zero1_sp", .dp = 2, .tp = 2, .zero = 1, .sp = true},
              {.name = "pp2_dp2_zero1_m2", .dp = 2, .pp = 2, .zero = 1, .accumulation = 2},
              {.name = "pp2_tp2_sp_1f1b_m4", .tp = 2, .pp = 2, .accumulation = 4, .sp = true},
              {.name = "cp4_p2p_T4096", .cp = 4, .block = 4096},
              {.name = "cp4_a2a_T4096", .cp = 4, .block = 4096, .cp_comm = CpCommMode::a2a},
              {.name = "cp2_dp2_zero1_llama",
               .family = ModelFamily::llama,
               .dp = 2,
               .zero = 1,
               .cp = 2}};
    default:
      return {};
  }
}

Config config_of(const AgreementCase& c) {
  Config cfg =
      test::small_tp_config(c.family, c.dp, c.tp, c.sp, c.block > 32 ? 1 : 2, c.accumulation);
  cfg.model.block_size = c.block;
  cfg.parallel.cp = c.cp;
  cfg.parallel.cp_comm = c.cp_comm;
  cfg.model.n_layer = 4;
  cfg.parallel.pp = c.pp;
  cfg.parallel.virtual_stages = c.v;
  cfg.parallel.pp_schedule = c.schedule;
  cfg.parallel.zero_stage = c.zero;
  cfg.training.recompute = c.recompute;
  cfg.training.precision = c.precision;
  return cfg;
}

std::int64_t bytes_of(const ProcessGroup& group) {
  std::int64_t sum = 0;
  for (std::size_t op = 0; op < kNumCommOps; ++op)
    sum += group.counter(static_cast<CommOp>(op)).bytes;
  return sum;
}

// The planner counts what a cp rank sends: ring sends (each has a receive of the same size)
// and the all-to-alls' inputs.
std::int64_t cp_sent(const ProcessGroup& group) {
  return group.counter(CommOp::send).bytes + group.counter(CommOp::all_to_all).bytes;
}

class PlanAgreement : public ::testing::TestWithParam<AgreementCase> {};

TEST_P(PlanAgreement, BytesPerStepExactlyAndMemoryWithinFivePercent) {
  const AgreementCase& c = GetParam();
  const auto world = test::runtime().world_group();
  TrackedAllocator::instance().reset_peaks();
  Trainer trainer(config_of(c), *world, test::quiet());
  const Config& config = trainer.config();  // vocabulary resolved from the data
  // The gradient reduction runs over dp × cp (the dp group itself when cp = 1).
  ProcessGroup& dp = c.cp > 1 ? trainer.mesh().dp_cp_group() : trainer.mesh().group(Axis::dp);
  ProcessGroup& cp = trainer.mesh().group(Axis::cp);
  ProcessGroup& tp = trainer.mesh().group(Axis::tp);
  ProcessGroup& pp = trainer.mesh().group(Axis::pp);
  const std::int64_t stage = pp.rank();
  const plan::ParameterCounts params = plan::stage_parameters(config, stage);

  // Step 1 grows the buffers; step 2 is measured (the bytes of every step are the same).
  for (int s = 0; s < 2; ++s) {
    const std::int64_t dp0 = bytes_of(dp), tp0 = bytes_of(tp), pp0 = bytes_of(pp);
    const std::int64_t cp0 = cp_sent(cp);
    const Trainer::Gradients g = trainer.compute_gradients(s);
    trainer.apply_update(s, g.grad_norm);
    if (s == 0) continue;
    EXPECT_EQ(bytes_of(dp) - dp0,
              static_cast<std::int64_t>(plan::dp_bytes_per_step(config, params)))
        << "dp bytes, stage " << stage;
    EXPECT_EQ(bytes_of(tp) - tp0,
              static_cast<std::int64_t>(plan::tp_bytes_per_step(config, params)))
        << "tp bytes, stage " << stage;
    EXPECT_EQ(bytes_of(pp) - pp0,
              static_cast<std::int64_t>(plan::pp_bytes_per_step(config, params)))
        << "pp bytes, stage " << stage;
    EXPECT_EQ(cp_sent(cp) - cp0, static_cast<std::int64_t>(plan::cp_bytes_per_step(config, params)))
        << "cp bytes sent, stage " << stage;
  }

  const plan::MemoryBreakdown state = plan::model_state_bytes(config, params.total);
  const TrackedAllocator& a = TrackedAllocator::instance();
  const auto peak = [&a](MemCategory m) { return static_cast<double>(a.stats(m).peak_bytes); };
  // A pipeline stage's posted receives ([b·s (/t with sp), h] fp32 boundary tensors, up to two
  // per local chunk) are alive at the peak or not depending on timing (the PipelineMemory test
  // bounds them the same way); the planner leaves them out, so under pp the measured
  // activation peak may exceed the planned one by that much on top of the 5 %.
  const double boundary =
      static_cast<double>(config.training.micro_batch * config.model.block_size /
                          config.parallel.cp * config.model.n_embd) *
      4.0 / static_cast<double>(config.parallel.sequence_parallel ? config.parallel.tp : 1);
  const double receives = config.parallel.pp > 1
                              ? 2.0 * static_cast<double>(config.parallel.virtual_stages) * boundary
                              : 0.0;
  const struct {
    const char* name;
    double planned, measured, timing;
  } rows[] = {
      {"params", state.params, peak(MemCategory::params), 0.0},
      {"grads", state.grads, peak(MemCategory::grads), 0.0},
      {"optimizer", state.optimizer, peak(MemCategory::optimizer), 0.0},
      {"activations", plan::activation_peak_bytes(config, params, stage),
       peak(MemCategory::activations), receives},
      {"comm", plan::comm_buffer_bytes(config, params), peak(MemCategory::comm), 0.0},
  };
  for (const auto& r : rows) {
    const double excess = std::max(0.0, std::min(r.measured - r.planned, r.timing));
    EXPECT_LE(std::abs(r.planned + excess - r.measured), 0.05 * r.measured + 1.0)
        << r.name << " on stage " << stage << ": planned " << r.planned << " B (+ up to "
        << r.timing << " B of posted receives), measured " << r.measured << " B";
  }
}

std::string case_name(const ::testing::TestParamInfo<AgreementCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PlanAgreement, ::testing::ValuesIn(cases_of_this_world()),
                         case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PlanAgreement);

}  // namespace
}  // namespace meshtrain
