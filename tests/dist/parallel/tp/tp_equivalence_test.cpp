// DESIGN invariants 1–3 for tensor (+ sequence) parallelism: every layout tp × dp = world size
// with tp ∈ {2, 4}, sequence parallelism off and on, both model families, equals tp = dp = 1 at
// the same global batch. The reference runs on every rank over a one-rank group. Compares the
// initial shards with the slices of the reference's weights (bitwise), the losses of 20 steps,
// every gradient after step 1 gathered to its logical tensor, the grad norm, and checks that
// the parameters replicated over tp are still bit-identical on every tp rank after 20 steps.
// The bytes each tp group moves per step are checked against the formula of
// docs/tensor_parallel.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "equivalence_harness.h"
#include "meshtrain/parallel/tp/gather.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

using test::quiet;

constexpr std::int64_t kGlobalBatch = 8;
constexpr int kSteps = 20;

// fp32: tensor parallelism re-associates the sums of every row-parallel product and of the
// vocabulary softmax (≈1e-7 relative); 1e-5 leaves headroom for 20 Adam steps, while a missing
// reduction, a wrong slice or a padding row in the softmax is off by ≥ 1e-3.
constexpr double kGradRtol = 1e-5;
constexpr double kNormRtol = 1e-6;
constexpr double kLossRtol = 1e-5;

// (family, tp, sequence parallel); dp = world size / tp.
using Layout = std::tuple<ModelFamily, int, bool>;

// The layouts of this mpirun's world size, known before MPI starts (GoogleTest instantiates
// parameters during static initialisation; OpenMPI puts the size in the environment):
// tp ∈ {2, 4} × dp ∈ {1, 2}, so np 2, 4 and 8 together cover all four (tp, dp) pairs.
std::vector<Layout> layouts_of_this_world() {
  const int world = test::launched_world_size();
  std::vector<Layout> out;
  for (const ModelFamily family : {ModelFamily::gpt2, ModelFamily::llama}) {
    for (int tp : {2, 4}) {
      if (world % tp != 0 || world / tp > 2) continue;
      for (bool sp : {false, true}) out.emplace_back(family, tp, sp);
    }
  }
  return out;
}

class TpLayout : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    ASSERT_EQ(test::runtime().world_size() % std::get<1>(GetParam()), 0);
    dp_ = test::runtime().world_size() / std::get<1>(GetParam());
  }
  int dp_ = 1;
};

TEST_P(TpLayout, MatchesSingleProcessAtSameGlobalBatch) {
  const auto& [family, tp, sp] = GetParam();
  test::Equivalence runs(test::small_tp_config(family, 1, 1, false, kGlobalBatch, 1),
                        test::small_tp_config(family, dp_, tp, sp, kGlobalBatch / dp_, 1));
  ProcessGroup& tp_group = runs.parallel().mesh().group(Axis::tp);
  const ParameterList& mine = runs.parallel().parameters();
  const ParameterList& ref = runs.reference().parameters();
  ASSERT_EQ(mine.size(), ref.size());
  for (std::size_t i = 0; i < mine.size(); ++i) ASSERT_EQ(mine[i]->name, ref[i]->name);

  // Invariant 1: every shard is the matching slice of the tp = 1 weight, bit for bit.
  ASSERT_NO_FATAL_FAILURE(runs.expect_same_initial_weights());

  runs.train(kSteps);
  runs.expect_equivalent({kGradRtol, kNormRtol, kLossRtol});

  // Replicated parameters: bit-identical to tp rank 0's copy after 20 steps; padding rows of
  // the vocabulary shards still zero.
  for (const Parameter* p : mine) {
    if (p->is_sharded()) {
      std::vector<bool> real(static_cast<std::size_t>(p->value.numel()), false);
      for (const ShardRun& run : runs_of(p->shard)) {
        for (std::int64_t i = 0; i < run.count; ++i)
          real[static_cast<std::size_t>(run.local + i)] = true;
      }
      for (std::int64_t i = 0; i < p->value.numel(); ++i) {
        if (!real[static_cast<std::size_t>(i)]) {
          ASSERT_EQ(p->value.f32()[i], 0.0f) << p->name << ": padding changed at " << i;
        }
      }
      continue;
    }
    Tensor rank0 = p->value.clone(MemCategory::other);
    tp_group.broadcast(std::as_writable_bytes(rank0.span_f32()), 0);
    EXPECT_EQ(std::memcmp(rank0.f32(), p->value.f32(), static_cast<std::size_t>(rank0.bytes())), 0)
        << p->name << " drifted apart on tp rank " << tp_group.rank();
  }
}

// Bytes per optimizer step on the tp group (docs/tensor_parallel.md): with n tokens per
// micro-batch, D = n·C·4 bytes and L layers, each micro-batch moves 4L + 2 tensors of D
// (embedding out, 2 per layer forward, 2 per layer backward, LM head input gradient) — as
// all-reduces without sequence parallelism; as reduce-scatters of D plus all-gathers of D/tp
// per rank with it — and the vocabulary-parallel loss adds all-reduces of n floats (max) and 2n
// floats (Σexp, target logit). Per step: the grad norm (one double) and, under sequence
// parallelism, one all-reduce of the replicated parameters' gradients.
// Full recompute runs each block's forward again in backward, its two tp collectives included:
// 6L + 2 tensors per micro-batch (plan/accounting.cpp's tp_bytes_per_step counts the same).
void check_tp_bytes_per_step(ModelFamily family, std::int64_t dp, std::int64_t tp, bool sp,
                             RecomputeMode recompute) {
  constexpr std::int64_t kAccumulation = 2;
  const auto world = test::runtime().world_group();
  Config config =
      test::small_tp_config(family, dp, tp, sp, kGlobalBatch / dp / kAccumulation, kAccumulation);
  config.training.recompute = recompute;
  Trainer trainer(config, *world, quiet());
  ProcessGroup& tp_group = trainer.mesh().group(Axis::tp);
  std::int64_t replicated_bytes = 0;
  for (const Parameter* p : trainer.parameters()) {
    if (!p->is_sharded()) replicated_bytes += p->grad.bytes();
  }
  tp_group.reset_counters();
  trainer.compute_gradients(0);

  const std::int64_t n = config.training.micro_batch * config.model.block_size;
  const std::int64_t D = n * config.model.n_embd * 4;
  const std::int64_t tensors = (recompute == RecomputeMode::full ? 6 : 4) * config.model.n_layer + 2;
  const std::int64_t loss_bytes = kAccumulation * 3 * n * 4;
  const CommCounter& ar = tp_group.counter(CommOp::all_reduce);
  const CommCounter& rs = tp_group.counter(CommOp::reduce_scatter);
  const CommCounter& ag = tp_group.counter(CommOp::all_gather);
  if (!sp) {
    EXPECT_EQ(ar.bytes, kAccumulation * tensors * D + loss_bytes + 8);
    EXPECT_EQ(ar.calls, kAccumulation * (tensors + 2) + 1);
    EXPECT_EQ(rs.calls, 0);
    EXPECT_EQ(ag.calls, 0);
  } else {
    EXPECT_EQ(rs.bytes, kAccumulation * tensors * D);
    EXPECT_EQ(rs.calls, kAccumulation * tensors);
    EXPECT_EQ(ag.bytes, kAccumulation * tensors * D / tp);
    EXPECT_EQ(ag.calls, kAccumulation * tensors);
    EXPECT_EQ(ar.bytes, loss_bytes + 8 + replicated_bytes);
    EXPECT_EQ(ar.calls, kAccumulation * 2 + 2);
  }
}

TEST_P(TpLayout, BytesPerStepEqualTheFormula) {
  const auto& [family, tp, sp] = GetParam();
  check_tp_bytes_per_step(family, dp_, tp, sp, RecomputeMode::none);
}

TEST_P(TpLayout, BytesPerStepWithFullRecomputeEqualTheFormula) {
  const auto& [family, tp, sp] = GetParam();
  check_tp_bytes_per_step(family, dp_, tp, sp, RecomputeMode::full);
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& info) {
  const auto& [family, tp, sp] = info.param;
  return std::string(to_string(family)) + "_tp" + std::to_string(tp) + (sp ? "_sp" : "");
}

// np 1 has no tensor-parallel layout.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TpLayout);
INSTANTIATE_TEST_SUITE_P(Layouts, TpLayout, ::testing::ValuesIn(layouts_of_this_world()),
                         layout_name);

}  // namespace
}  // namespace meshtrain
