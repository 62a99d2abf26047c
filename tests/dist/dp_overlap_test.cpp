// Data-parallel overlap (parallel.overlap_grad_reduce, parallel/dp/grad_buckets.h): posting each
// gradient bucket's all-reduce during backward, as soon as the step's last backward of its
// parameters is done, gives bit for bit the losses, step-1 gradients, grad norm and parameters
// of reducing every bucket after backward — at dp 2 and 4, with gradient accumulation, with
// tp × dp (+ sequence parallel) and with pp × dp (1F1B, gpt2's tied embedding on two stages) —
// and both match one process at the same global batch within the tolerance of the existing
// equivalence test of that layout (dp_equivalence_test: 1e-6 gradients; tp/pp: 1e-5). A bucket
// posted before its last gradient contribution would reduce a partial sum and differ. The
// model has 4 blocks of 128 features (llama: SwiGLU 512) and 1 MiB buckets, so several exist and
// the early ones really go out while earlier blocks compute (checked: at least 2 buckets were
// posted during backward with overlap on, none with it off). Under zb_h1 overlap is turned off
// (weight gradients wait for W passes): no bucket is posted early, same results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../support/test_config.h"
#include "../support/training_run.h"
#include "dist_env.h"

namespace meshtrain {
namespace {

using test::max_abs;
using test::max_abs_diff;
using test::quiet;
using test::TrainedRun;

constexpr std::int64_t kGlobalBatch = 8;
constexpr int kSteps = 5;

struct OverlapLayout {
  ModelFamily family;
  int dp, tp, pp;
  bool sp;
  std::int64_t accumulation;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
};

std::string name_of(const OverlapLayout& l) {
  std::string s = std::string(to_string(l.family)) + "_dp" + std::to_string(l.dp);
  if (l.tp > 1) s += "_tp" + std::to_string(l.tp) + (l.sp ? "sp" : "");
  if (l.pp > 1) s += "_pp" + std::to_string(l.pp) + "_" + std::string(to_string(l.schedule));
  return s + "_acc" + std::to_string(l.accumulation);
}

void PrintTo(const OverlapLayout& l, std::ostream* os) { *os << name_of(l); }

// np 2: dp 2 without and with accumulation; np 4: dp 4 (both), tp 2 × dp 2 + sp (llama),
// pp 2 × dp 2 under 1F1B (gpt2, tied embedding over stages) and under zb_h1 (overlap off).
std::vector<OverlapLayout> layouts_of_this_world() {
  using enum ModelFamily;
  using enum PipelineSchedule;
  const int world = test::launched_world_size();
  if (world == 2) return {{gpt2, 2, 1, 1, false, 1}, {gpt2, 2, 1, 1, false, 4}};
  if (world == 4) {
    return {{gpt2, 4, 1, 1, false, 1},
            {llama, 4, 1, 1, false, 2},
            {llama, 2, 2, 1, true, 2},
            {gpt2, 2, 1, 2, false, 4, one_f_one_b},
            {llama, 2, 1, 2, false, 4, zb_h1}};
  }
  return {};
}

Config overlap_config(const OverlapLayout& l, bool overlap) {
  const std::int64_t micro = kGlobalBatch / l.dp / l.accumulation;
  Config c = test::small_tp_config(l.family, l.dp, l.tp, l.sp, micro, l.accumulation);
  c.model.n_layer = 4;
  // 4 blocks of ≈0.8 MB (gpt2) or ≈1 MB (llama with a SwiGLU of 512; 0.5 MB per tp 2 rank):
  // several 1 MiB buckets in every layout.
  c.model.n_embd = 128;
  if (l.family == ModelFamily::llama) c.model.ffn_hidden = 512;
  c.parallel.bucket_mib = 1;
  c.parallel.pp = l.pp;
  c.parallel.pp_schedule = l.schedule;
  c.parallel.overlap_grad_reduce = overlap;
  return c;
}

// The existing equivalence tests' tolerances against one process: dp alone
// (dp_equivalence_test) 1e-6 on gradients, with tp or pp (tp/pp_equivalence_test) 1e-5.
double grad_rtol(const OverlapLayout& l) { return l.tp > 1 || l.pp > 1 ? 1e-5 : 1e-6; }
constexpr double kNormRtol = 1e-6;
constexpr double kLossRtol = 1e-5;

void expect_bitwise(const TrainedRun& a, const TrainedRun& b, const Trainer& on,
                    const Trainer& off) {
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.grad_norm_step1, b.grad_norm_step1);
  ASSERT_EQ(a.grads_step1.size(), b.grads_step1.size());
  for (std::size_t i = 0; i < a.grads_step1.size(); ++i) {
    EXPECT_EQ(max_abs_diff(a.grads_step1[i], b.grads_step1[i]), 0.0) << on.parameters()[i]->name;
  }
  for (std::size_t i = 0; i < on.parameters().size(); ++i) {
    const Tensor& x = on.parameters()[i]->value;
    const Tensor& y = off.parameters()[i]->value;
    EXPECT_EQ(std::memcmp(x.f32(), y.f32(), static_cast<std::size_t>(x.bytes())), 0)
        << on.parameters()[i]->name << " after " << kSteps << " steps";
  }
}

void expect_near_reference(const TrainedRun& want, const Trainer& reference, const TrainedRun& got,
                           const Trainer& parallel, double rtol) {
  std::map<std::string, std::size_t> ref_index;
  for (std::size_t i = 0; i < reference.parameters().size(); ++i) {
    ref_index[reference.parameters()[i]->name] = i;
  }
  EXPECT_NEAR(got.grad_norm_step1, want.grad_norm_step1, kNormRtol * want.grad_norm_step1);
  for (std::size_t i = 0; i < parallel.parameters().size(); ++i) {
    const std::string& name = parallel.parameters()[i]->name;
    ASSERT_TRUE(ref_index.count(name)) << name;
    const Tensor& ref = want.grads_step1[ref_index[name]];
    EXPECT_LE(max_abs_diff(got.grads_step1[i], ref), rtol * max_abs(ref)) << name;
  }
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], kLossRtol * std::abs(want.losses[s]))
        << "step " << s + 1;
  }
}

// iall_reduce_sum on rank-valued inputs (exact in fp32): 1.5 M elements, so the 4 MiB chunks
// are two posts, tested until done; the counters count one all_reduce call of the buffer's
// bytes and no blocked seconds. A group of one completes at once and counts nothing.
TEST(IallReduce, SumsInChunksCountsOneCallAndCompletesUnderTest) {
  const auto world = test::runtime().world_group();
  const int n = world->size(), r = world->rank();
  constexpr std::size_t kCount = 1'500'000;  // 6 MB: two 4 MiB chunks
  std::vector<float> x(kCount);
  for (std::size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>((r + 1) * (i % 1000));
  const CommCounter before = world->counter(CommOp::all_reduce);
  std::unique_ptr<CommRequest> request = world->iall_reduce_sum(x);
  int polls = 0;
  while (!request->test()) ++polls;  // progress only inside MPI calls: test() drives it
  request->wait();                   // done: returns at once
  const float ranks = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t i = 0; i < kCount; i += 997) {
    ASSERT_EQ(x[i], ranks * static_cast<float>(i % 1000)) << "element " << i;
  }
  EXPECT_EQ(x[kCount - 1], ranks * static_cast<float>((kCount - 1) % 1000));
  const CommCounter after = world->counter(CommOp::all_reduce);
  EXPECT_EQ(after.calls - before.calls, n > 1 ? 1 : 0);
  EXPECT_EQ(after.bytes - before.bytes, n > 1 ? static_cast<std::int64_t>(kCount * 4) : 0);
  EXPECT_EQ(after.seconds - before.seconds, 0.0) << "completed by test(): nothing blocked";
  if (n == 1) {
    EXPECT_EQ(polls, 0);
  }
}

class DpOverlap : public ::testing::TestWithParam<OverlapLayout> {};

TEST_P(DpOverlap, OnAndOffAreBitwiseAndMatchOneProcess) {
  const OverlapLayout& l = GetParam();
  MpiRuntime& rt = test::runtime();
  const auto world = rt.world_group();
  Trainer on(overlap_config(l, true), *world, quiet());
  const TrainedRun a = test::train_steps(on, kSteps);
  Trainer off(overlap_config(l, false), *world, quiet());
  const TrainedRun b = test::train_steps(off, kSteps);
  expect_bitwise(a, b, on, off);

  // The overlap is real: with it on, buckets of the last step went out during backward (at
  // least 2 of the model's several), with it off (or under zb_h1) none did.
  const std::size_t early = on.zero().buckets_posted_in_backward();
  if (l.schedule == PipelineSchedule::zb_h1) {
    EXPECT_EQ(early, 0u);
  } else {
    EXPECT_GE(early, 2u) << "expected several 1 MiB buckets posted during backward";
  }
  EXPECT_EQ(off.zero().buckets_posted_in_backward(), 0u);

  const auto self = rt.self_group();
  Config one = overlap_config({l.family, 1, 1, 1, false, 1}, true);
  one.training.micro_batch = kGlobalBatch;
  Trainer reference(one, *self, quiet());
  const TrainedRun want = test::train_steps(reference, kSteps);
  expect_near_reference(want, reference, a, on, grad_rtol(l));
}

std::string layout_name(const ::testing::TestParamInfo<OverlapLayout>& info) {
  return name_of(info.param);
}

// np 1 and np 8 have no layout here (dp 2 and 4 are the np 2 and np 4 runs).
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DpOverlap);
INSTANTIATE_TEST_SUITE_P(Layouts, DpOverlap, ::testing::ValuesIn(layouts_of_this_world()),
                         layout_name);

}  // namespace
}  // namespace meshtrain
