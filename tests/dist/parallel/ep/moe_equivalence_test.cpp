// MoE training under expert parallel (issue 14) against one process at the same global batch
// (DESIGN invariant 3): a llama with 4 experts of top-2 in every block, 20 steps. The one-process
// run uses the same micro-batch and dp× the accumulation, so its micro-batch j holds exactly
// the sequences of rank d's micro-batch m (j = m·dp + d, data/sampler.h): the aux loss and the
// capacity dropping see the same token sets. Layouts: ep 2 and 4 over dp, with ZeRO 1 and 3,
// with tp 2 (+ sequence parallel), with pp 2 (1F1B) and with cp 2 — dropless everywhere, plus
// capacity 1.0 at dp 2 × ep 2, full recompute and bf16 (np 2), and pp 2 under GPipe,
// interleaved 1F1B and ZB-H1 (np 4). Under sp and cp a micro-batch's tokens are split over
// ranks, and the aux and z losses must still be the micro-batch's (MoeTokenGroup); capacity is
// per rank there, so those layouts are dropless.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "equivalence_harness.h"
#include "meshtrain/train/moe_metrics.h"

namespace meshtrain {
namespace {

// fp32 with the bounds: the expert owner adds its ep group's rows in another order,
// and dp / edp means add ranks in another order (≈1e-7 relative).
constexpr double kGradRtol = 1e-5;
constexpr double kNormRtol = 1e-6;
constexpr double kLossRtol = 1e-5;
constexpr int kSteps = 20;
constexpr std::int64_t kMicroBatch = 2;

struct MoeLayout {
  int dp, ep, tp;
  bool sp;
  int pp, cp, zero;
  double capacity;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  RecomputeMode recompute = RecomputeMode::none;
  Precision precision = Precision::fp32;  // the reference runs in the same precision
};

// bf16 against bf16 on one process: the same roundings, but the ranks' sums (dp, edp means,
// the owners' gathered rows) add in other orders; CpEquivalence's bf16 bounds.
constexpr double kBf16LossRtol = 1e-3;
constexpr double kBf16GradRtol = 5e-3;

std::string name_of(const MoeLayout& l) {
  std::string s = "dp" + std::to_string(l.dp) + "_ep" + std::to_string(l.ep);
  if (l.tp > 1) s += "_tp" + std::to_string(l.tp) + (l.sp ? "sp" : "");
  if (l.pp > 1) s += "_pp" + std::to_string(l.pp);
  if (l.cp > 1) s += "_cp" + std::to_string(l.cp);
  if (l.zero > 0) s += "_zero" + std::to_string(l.zero);
  if (l.capacity > 0) s += "_capacity";
  if (l.pp > 1 && l.schedule != PipelineSchedule::one_f_one_b)
    s += "_" + std::string(to_string(l.schedule));
  if (l.recompute != RecomputeMode::none) s += "_" + std::string(to_string(l.recompute));
  if (l.precision != Precision::fp32) s += "_" + std::string(to_string(l.precision));
  return s;
}

Config moe_config(const MoeLayout& l, std::int64_t accumulation) {
  Config c = test::small_tp_config(ModelFamily::llama, l.dp, l.tp, l.sp, kMicroBatch, accumulation);
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_ffn_hidden = 48;
  c.model.moe_capacity_factor = l.capacity;
  // Strong enough that a wrong share of the aux or z gradient (×cp, ×tp) shows in step 1's
  // router gradient beyond 1e-5.
  c.model.moe_aux_loss_coeff = 0.1;
  c.model.moe_z_loss_coeff = 0.01;
  c.parallel.ep = l.ep;
  c.parallel.pp = l.pp;
  c.parallel.cp = l.cp;
  c.parallel.zero_stage = l.zero;
  c.parallel.pp_schedule = l.schedule;
  c.training.recompute = l.recompute;
  c.training.precision = l.precision;
  if (l.schedule == PipelineSchedule::interleaved_1f1b) {  // 2 chunks per rank of one layer
    c.parallel.virtual_stages = 2;
    c.model.n_layer = 4;
  }
  return c;
}

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const MoeLayout& l, std::ostream* os) { *os << name_of(l); }

class MoeEquivalence : public ::testing::TestWithParam<MoeLayout> {};

TEST_P(MoeEquivalence, MatchesOneProcess) {
  const MoeLayout l = GetParam();
  Config single = moe_config({1, 1, 1, false, 1, 1, 0, l.capacity}, 2 * l.dp);
  single.training.precision = l.precision;
  single.model.n_layer = moe_config(l, 2).model.n_layer;
  test::Equivalence runs(single, moe_config(l, 2));
  Trainer& reference = runs.reference();
  Trainer& parallel = runs.parallel();

  runs.train(kSteps);
  const bool bf16 = l.precision == Precision::bf16;
  const double grad_rtol = bf16 ? kBf16GradRtol : kGradRtol;
  const double norm_rtol = bf16 ? kBf16GradRtol : kNormRtol;
  const double loss_rtol = bf16 ? kBf16LossRtol : kLossRtol;
  runs.expect_equivalent({grad_rtol, norm_rtol, loss_rtol});
  if (l.ep > 1) {
    int experts = 0;
    for (const Parameter* p : parallel.parameters())
      experts += p->placement.replicas == ReplicaGroup::expert ? 1 : 0;
    EXPECT_GT(experts, 0) << "no expert parameter on this rank";
  }
  // The routing of the 20 steps, summed over the global batch: the same token counts per
  // expert, and the same aux and z losses (the micro-batch's, whatever splits its tokens).
  const ModelConfig& m = parallel.config().model;
  const bool sp = parallel.config().parallel.sequence_parallel;
  const std::vector<MoeLayerMetrics> got_moe =
      collect_moe_metrics(parallel.stage(), parallel.mesh(), m, sp);
  const std::vector<MoeLayerMetrics> want_moe =
      collect_moe_metrics(reference.stage(), reference.mesh(), m, false);
  ASSERT_EQ(got_moe.size(), want_moe.size());
  for (std::size_t i = 0; i < got_moe.size(); ++i) {
    // In bf16 a 16-bit rounding may flip a router near-tie, so only fp32 compares counts.
    if (!bf16) {
      EXPECT_EQ(got_moe[i].routed_per_expert, want_moe[i].routed_per_expert) << "layer " << i;
      EXPECT_EQ(got_moe[i].tokens_per_expert, want_moe[i].tokens_per_expert) << "layer " << i;
    }
    EXPECT_NEAR(got_moe[i].aux_loss, want_moe[i].aux_loss, loss_rtol * want_moe[i].aux_loss)
        << "layer " << i;
    EXPECT_NEAR(got_moe[i].z_loss, want_moe[i].z_loss, loss_rtol * want_moe[i].z_loss)
        << "layer " << i;
  }
}

std::vector<MoeLayout> layouts_of_this_world() {
  const int world = test::launched_world_size();
  std::vector<MoeLayout> out;
  if (world == 2) {
    out.push_back({2, 2, 1, false, 1, 1, 0, 0.0});
    out.push_back({2, 2, 1, false, 1, 1, 0, 1.0});
    out.push_back({2, 2, 1, false, 1, 1, 3, 0.0});
    out.push_back(
        {2, 2, 1, false, 1, 1, 0, 0.0, PipelineSchedule::one_f_one_b, RecomputeMode::full});
    out.push_back({2, 2, 1, false, 1, 1, 1, 0.0, PipelineSchedule::one_f_one_b, RecomputeMode::none,
                   Precision::bf16});
  } else if (world == 4) {
    out.push_back({4, 4, 1, false, 1, 1, 0, 0.0});
    out.push_back({4, 2, 1, false, 1, 1, 1, 0.0});
    out.push_back({4, 4, 1, false, 1, 1, 3, 0.0});
    out.push_back({2, 2, 2, true, 1, 1, 0, 0.0});
    out.push_back({2, 2, 2, false, 1, 1, 0, 0.0});
    out.push_back({2, 2, 1, false, 2, 1, 0, 0.0});
    out.push_back({2, 2, 1, false, 2, 1, 0, 0.0, PipelineSchedule::gpipe});
    out.push_back({2, 2, 1, false, 2, 1, 0, 0.0, PipelineSchedule::interleaved_1f1b});
    out.push_back({2, 2, 1, false, 2, 1, 1, 0.0, PipelineSchedule::zb_h1});
    out.push_back({2, 2, 1, false, 1, 2, 0, 0.0});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeEquivalence, ::testing::ValuesIn(layouts_of_this_world()),
                         [](const ::testing::TestParamInfo<MoeLayout>& p) {
                           return name_of(p.param);
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MoeEquivalence);

}  // namespace
}  // namespace meshtrain
