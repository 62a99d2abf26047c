// DESIGN invariants 1–3 for pipeline parallelism: every schedule over pp ∈ {2, 4} (interleaved
// with 2 model chunks per rank), and pp = 2 with tp = 2 (+ sequence parallel) and with dp = 2,
// both model families, equals one process at the same global batch. The reference runs on
// every rank over a one-rank group. Compares the losses of 20 steps, every gradient after
// step 1 (each stage its own parameters, gathered over tp, against the reference's parameter of
// the same name), the grad norm, and checks that gpt2's tied embedding and its copy on the last
// stage are bit-identical after 20 steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "equivalence_harness.h"

namespace meshtrain {
namespace {

using test::max_abs_diff;
using test::quiet;
using test::TrainedRun;

constexpr std::int64_t kGlobalBatch = 8;
constexpr std::int64_t kMicrobatches = 4;
constexpr int kSteps = 20;
// fp32: a pipeline computes every micro-batch exactly as one process does; only the order in
// which micro-batch gradients are accumulated, and the tp/dp re-associations, differ (≈1e-7).
constexpr double kGradRtol = 1e-5;
constexpr double kNormRtol = 1e-6;
constexpr double kLossRtol = 1e-5;

struct PpLayout {
  ModelFamily family;
  PipelineSchedule schedule;
  int pp, v, tp, dp;
  bool sp;
};

std::string name_of(const PpLayout& l) {
  std::string s = std::string(to_string(l.family)) + "_" + std::string(to_string(l.schedule)) +
                  "_pp" + std::to_string(l.pp);
  if (l.v > 1) s += "_v" + std::to_string(l.v);
  if (l.tp > 1) s += "_tp" + std::to_string(l.tp) + (l.sp ? "sp" : "");
  if (l.dp > 1) s += "_dp" + std::to_string(l.dp);
  return s;
}

// The layouts of this mpirun's world size (known before MPI starts: OpenMPI puts it in the
// environment): np 2 runs every schedule at pp 2, np 4 every schedule at pp 4 and pp 2 with
// tp 2 (+sp) or dp 2, np 8 pp 2 × tp 2 × dp 2.
std::vector<PpLayout> layouts_of_this_world() {
  const int world = test::launched_world_size();
  std::vector<PpLayout> out;
  using enum PipelineSchedule;
  for (const ModelFamily family : {ModelFamily::gpt2, ModelFamily::llama}) {
    if (world == 2 || world == 4) {
      for (const PipelineSchedule schedule : {gpipe, one_f_one_b, interleaved_1f1b, zb_h1}) {
        const int v = schedule == interleaved_1f1b ? 2 : 1;
        out.push_back({family, schedule, world, v, 1, 1, false});
      }
    }
    if (world == 4) {
      out.push_back({family, one_f_one_b, 2, 1, 2, 1, true});
      out.push_back({family, zb_h1, 2, 1, 2, 1, false});
      out.push_back({family, interleaved_1f1b, 2, 2, 1, 2, false});
    }
    if (world == 8) out.push_back({family, one_f_one_b, 2, 1, 2, 2, true});
  }
  return out;
}

Config pp_config(const PpLayout& l) {
  Config c = test::small_tp_config(l.family, l.dp, l.tp, l.sp, kGlobalBatch / l.dp / kMicrobatches,
                                   kMicrobatches);
  c.model.n_layer = 8;  // ≥ pp · v = 8 chunks for pp 4 interleaved
  c.parallel.pp = l.pp;
  c.parallel.pp_schedule = l.schedule;
  c.parallel.virtual_stages = l.v;
  return c;
}

void PrintTo(const PpLayout& l, std::ostream* os) { *os << name_of(l); }

class PipelineLayout : public ::testing::TestWithParam<PpLayout> {};

TEST_P(PipelineLayout, MatchesSingleProcessAtSameGlobalBatch) {
  const PpLayout& l = GetParam();
  Config one = pp_config({l.family, PipelineSchedule::one_f_one_b, 1, 1, 1, 1, false});
  one.training.micro_batch = kGlobalBatch;
  one.training.accumulation = 1;
  test::Equivalence runs(one, pp_config(l));
  Trainer& reference = runs.reference();
  Trainer& parallel = runs.parallel();
  ProcessGroup& tp = parallel.mesh().group(Axis::tp);

  // Initial weights: every local parameter is the slice of the reference's of the same name.
  ASSERT_NO_FATAL_FAILURE(runs.expect_same_initial_weights());

  runs.train(kSteps);
  runs.expect_equivalent({kGradRtol, kNormRtol, kLossRtol});

  // gpt2: the first stage's token embedding and the last stage's copy, bit for bit.
  if (l.family == ModelFamily::gpt2) {
    ProcessGroup& pp = parallel.mesh().group(Axis::pp);
    const Parameter* mine = nullptr;
    for (const Parameter* p : parallel.stage().tied_embeddings()) mine = p;
    Tensor first = Tensor::zeros(reference.parameters()[0]->value.shape(), MemCategory::other);
    if (pp.rank() == 0) first = gather_logical(*mine, mine->value, tp);
    pp.broadcast(std::as_writable_bytes(first.span_f32()), 0);
    if (pp.rank() == pp.size() - 1) {
      ASSERT_NE(mine, nullptr);
      EXPECT_TRUE(mine->placement.tied_copy);
      const Tensor last = gather_logical(*mine, mine->value, tp);
      EXPECT_EQ(std::memcmp(first.f32(), last.f32(), static_cast<std::size_t>(last.bytes())), 0)
          << "tied embedding copies drifted apart";
    }
  }
}

// Gradient accumulation over the m micro-batches of a pipeline step still makes exactly one
// data-parallel reduction of this stage's gradients (plus the 8-byte loss) per step.
TEST_P(PipelineLayout, OneDataParallelReductionPerStep) {
  const PpLayout& l = GetParam();
  const auto world = test::runtime().world_group();
  Trainer trainer(pp_config(l), *world, quiet());
  std::int64_t grad_bytes = 0;
  for (const Parameter* p : trainer.parameters()) grad_bytes += p->grad.bytes();
  ProcessGroup& dp = trainer.mesh().group(Axis::dp);
  dp.reset_counters();
  trainer.compute_gradients(0);
  const CommCounter& ar = dp.counter(CommOp::all_reduce);
  EXPECT_EQ(ar.calls, l.dp > 1 ? 2 : 0);
  EXPECT_EQ(ar.bytes, l.dp > 1 ? grad_bytes + 8 : 0);
}

std::string layout_name(const ::testing::TestParamInfo<PpLayout>& info) {
  return name_of(info.param);
}

// np 1 has no pipeline layout.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PipelineLayout);
INSTANTIATE_TEST_SUITE_P(Layouts, PipelineLayout, ::testing::ValuesIn(layouts_of_this_world()),
                         layout_name);

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// Activation recompute inside a pipeline (ZB-H1: blocks recompute in B, weight gradients wait
// for W) and with tensor + sequence parallelism: selective (the attention core, whose output
// the row-parallel projection reads again in W) and full are bitwise the run without
// recompute, for both families (gpt2's fused q/k/v shard and llama's separate ones).
// Instantiated only where its layouts exist: pp 2 at np 2, pp 2 × tp 2 + sp at np 4.
std::vector<int> recompute_worlds() {
  const int world = test::launched_world_size();
  return world == 2 || world == 4 ? std::vector<int>{world} : std::vector<int>{};
}

class PipelineRecompute : public ::testing::TestWithParam<int> {};

TEST_P(PipelineRecompute, SelectiveAndFullAreBitwiseWithinPipelineAndTensorParallel) {
  const auto world = test::runtime().world_group();
  ASSERT_EQ(world->size(), GetParam());
  for (const ModelFamily family : {ModelFamily::gpt2, ModelFamily::llama}) {
    auto config = [&](RecomputeMode recompute) {
      const int tp = world->size() == 4 ? 2 : 1;
      Config c = test::small_tp_config(family, 1, tp, tp > 1, 2, kMicrobatches);
      c.model.n_layer = 4;
      c.parallel.pp = 2;
      c.parallel.pp_schedule = PipelineSchedule::zb_h1;
      c.training.recompute = recompute;
      return c;
    };
    Trainer none(config(RecomputeMode::none), *world, quiet());
    const TrainedRun a = test::train_steps(none, 5);
    for (const RecomputeMode mode : {RecomputeMode::selective, RecomputeMode::full}) {
      Trainer other(config(mode), *world, quiet());
      const TrainedRun b = test::train_steps(other, 5);
      EXPECT_EQ(a.losses, b.losses) << family << ", " << mode;
      EXPECT_EQ(a.grad_norm_step1, b.grad_norm_step1) << family << ", " << mode;
      ASSERT_EQ(a.grads_step1.size(), b.grads_step1.size()) << family << ", " << mode;
      for (std::size_t i = 0; i < a.grads_step1.size(); ++i) {
        EXPECT_EQ(max_abs_diff(a.grads_step1[i], b.grads_step1[i]), 0.0)
            << family << ", " << mode << ": " << none.parameters()[i]->name;
      }
    }
  }
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PipelineRecompute);
INSTANTIATE_TEST_SUITE_P(Worlds, PipelineRecompute, ::testing::ValuesIn(recompute_worlds()));

}  // namespace
}  // namespace meshtrain
