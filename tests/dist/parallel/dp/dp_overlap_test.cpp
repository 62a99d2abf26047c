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
// ZeRO stages 1–3 (parallel/dp/zero_reduce.h) the same way: the gradient reduce-scatters
// posted during backward (stage 1: buckets once per step; stages 2–3: every unit, every
// micro-batch) give bit for bit the losses, step-1 gradients, grad norm and master weights of
// reducing without overlap, at dp 2 and 4 with and without accumulation, and match one
// process; ProcessGroup::ireduce_scatter_sum is bitwise the blocking ring's reduce-scatter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
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

// iall_reduce_sum on rank-valued inputs (exact in fp32), by messages, scaled by 0.5 (exact):
// 1.5 M elements, so the 4 MiB chunks are two posts, tested until done (the test() that
// completes applies the scale); the counters count one all_reduce call of the buffer's bytes
// and no blocked seconds. A group of one scales at once and counts nothing.
TEST(IallReduce, SumsInChunksCountsOneCallAndCompletesUnderTest) {
  const auto world = test::runtime().world_group();
  const int n = world->size(), r = world->rank();
  constexpr std::size_t kCount = 1'500'000;  // 6 MB: two 4 MiB chunks
  std::vector<float> x(kCount);
  for (std::size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>((r + 1) * (i % 1000));
  const CommCounter before = world->counter(CommOp::all_reduce);
  std::unique_ptr<CommRequest> request = world->iall_reduce_sum(x, 0.5f);
  int polls = 0;
  while (!request->test()) ++polls;  // progress only inside MPI calls: test() drives it
  request->wait();                   // done: returns at once
  const float ranks = 0.5f * static_cast<float>(n * (n + 1) / 2);
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

// ---------------------------------------------------------------------------------------------
// ireduce_scatter_sum: the blocking ring's additions, so its result is bitwise
// reduce_scatter_sum's, and both are the sum (double-precision reference, 1e-6). Rank q's
// input element i is a non-integer function of (q, i), so a different summation order would
// show in the last bits. 1.2 M elements per rank block (4.8 MB: two 4 MiB chunks per step);
// two rings in flight at once, tested in the reverse of their posting order, do not mix.
float input_of(int q, std::size_t i) {
  const double x = std::sin(0.37 * static_cast<double>(i) + 1.3 * q) * (1.0 + 0.1 * q);
  return static_cast<float>(x);
}

TEST(IreduceScatter, BitwiseTheBlockingRingAndCountsOneCall) {
  const auto world = test::runtime().world_group();
  const int n = world->size(), r = world->rank();
  constexpr std::size_t kBlock = 1'200'000;
  const auto input = [&](float shift) {
    std::vector<float> in(kBlock * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = input_of(r, i) + shift;
    return in;
  };
  std::vector<float> blocking(kBlock), first(kBlock), second(kBlock);
  const std::vector<float> in0 = input(0.0f);
  world->reduce_scatter_sum(in0, blocking);
  std::vector<float> in1 = input(0.0f), in2 = input(0.5f);  // clobbered by the rings
  const CommCounter before = world->counter(CommOp::reduce_scatter);
  std::unique_ptr<CommRequest> a = world->ireduce_scatter_sum(in1, first);
  std::unique_ptr<CommRequest> b = world->ireduce_scatter_sum(in2, second);
  bool a_done = false, b_done = false;
  while (!(a_done && b_done)) {  // the ring's steps move on only inside test()
    b_done = b->test();
    a_done = a->test();
  }
  a->wait();
  b->wait();
  EXPECT_EQ(std::memcmp(first.data(), blocking.data(), kBlock * sizeof(float)), 0);
  for (std::size_t k = 0; k < kBlock; k += 991) {
    const std::size_t i = static_cast<std::size_t>(r) * kBlock + k;
    double want = 0.0, want_shifted = 0.0;
    for (int q = 0; q < n; ++q) {
      want += static_cast<double>(input_of(q, i));
      want_shifted += static_cast<double>(input_of(q, i) + 0.5f);
    }
    ASSERT_NEAR(first[k], want, 1e-6 * n) << "element " << k;
    ASSERT_NEAR(second[k], want_shifted, 1e-6 * n) << "element " << k << " of the second ring";
  }
  const CommCounter after = world->counter(CommOp::reduce_scatter);
  EXPECT_EQ(after.calls - before.calls, n > 1 ? 2 : 0);
  EXPECT_EQ(after.bytes - before.bytes, n > 1 ? static_cast<std::int64_t>(2 * in1.size() * 4) : 0);
  EXPECT_EQ(after.seconds - before.seconds, 0.0) << "completed by test(): nothing blocked";
}

// ZeRO stage `zero` at dp = world / tp; gpt2 of 4 blocks, 130 features in 2 heads (biases and
// norms of 130 and 390 elements: padded slices at dp 4), 1 MiB buckets: several stage-1
// buckets and six units.
struct ZeroOverlapLayout {
  int zero, dp, tp;
  bool sp;
  std::int64_t accumulation;
};

std::string zero_name_of(const ZeroOverlapLayout& l) {
  std::string s = "zero" + std::to_string(l.zero) + "_dp" + std::to_string(l.dp);
  if (l.tp > 1) s += "_tp" + std::to_string(l.tp) + (l.sp ? "sp" : "");
  return s + "_acc" + std::to_string(l.accumulation);
}

void PrintTo(const ZeroOverlapLayout& l, std::ostream* os) { *os << zero_name_of(l); }

std::vector<ZeroOverlapLayout> zero_layouts_of_this_world() {
  const int world = test::launched_world_size();
  if (world == 2) {
    return {{1, 2, 1, false, 1},
            {1, 2, 1, false, 4},
            {2, 2, 1, false, 1},
            {2, 2, 1, false, 4},
            {3, 2, 1, false, 2}};
  }
  if (world == 4) return {{1, 4, 1, false, 2}, {2, 4, 1, false, 2}, {2, 2, 2, true, 2}};
  return {};
}

Config zero_overlap_config(const ZeroOverlapLayout& l, bool overlap) {
  const std::int64_t micro = kGlobalBatch / l.dp / l.accumulation;
  Config c = test::small_tp_config(ModelFamily::gpt2, l.dp, l.tp, l.sp, micro, l.accumulation);
  c.model.n_layer = 4;
  c.model.n_embd = 130;
  c.model.n_head = 2;
  c.parallel.bucket_mib = 1;
  c.parallel.zero_stage = l.zero;
  c.parallel.overlap_grad_reduce = overlap;
  return c;
}

// Each rank's master slices (stage 3 frees the full values; the masters are what steps).
void expect_same_masters(Trainer& on, Trainer& off) {
  const OptimizerShards& a = on.zero().shards();
  const OptimizerShards& b = off.zero().shards();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].master.numel(), b[i].master.numel()) << a[i].param->name;
    EXPECT_EQ(std::memcmp(a[i].master.f32(), b[i].master.f32(),
                          static_cast<std::size_t>(a[i].master.bytes())),
              0)
        << a[i].param->name << " after " << kSteps << " steps";
  }
}

class ZeroOverlap : public ::testing::TestWithParam<ZeroOverlapLayout> {};

TEST_P(ZeroOverlap, OnAndOffAreBitwiseAndMatchOneProcess) {
  const ZeroOverlapLayout& l = GetParam();
  MpiRuntime& rt = test::runtime();
  const auto world = rt.world_group();
  Trainer on(zero_overlap_config(l, true), *world, quiet());
  const TrainedRun a = test::train_steps(on, kSteps);
  Trainer off(zero_overlap_config(l, false), *world, quiet());
  const TrainedRun b = test::train_steps(off, kSteps);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.grad_norm_step1, b.grad_norm_step1);
  ASSERT_EQ(a.grads_step1.size(), b.grads_step1.size());
  for (std::size_t i = 0; i < a.grads_step1.size(); ++i) {
    EXPECT_EQ(std::memcmp(a.grads_step1[i].f32(), b.grads_step1[i].f32(),
                          static_cast<std::size_t>(a.grads_step1[i].bytes())),
              0)
        << on.parameters()[i]->name;
  }
  expect_same_masters(on, off);

  // The overlap is real: with it on, the last step's reduce-scatters went out during backward
  // and stayed in flight there (stage 1: its several 1 MiB buckets; stages 2–3: six units per
  // micro-batch), with it off none did.
  const auto units = static_cast<std::size_t>(6 * l.accumulation);
  EXPECT_GE(on.zero().buckets_posted_in_backward(), l.zero == 1 ? std::size_t{2} : units);
  EXPECT_EQ(off.zero().buckets_posted_in_backward(), 0u);
  // dp_comm_exposed_s counts the hooks' reduction time: posting with overlap, and at stages
  // 2–3 without it the whole reduce-scatters.
  EXPECT_GT(on.zero().reduce_seconds_in_backward(), 0.0);
  if (l.zero >= 2) {
    EXPECT_GT(off.zero().reduce_seconds_in_backward(), 0.0);
  }

  const auto self = rt.self_group();
  ZeroOverlapLayout single = l;
  single.dp = single.tp = 1;
  single.sp = false;
  single.accumulation = 1;
  Config one = zero_overlap_config(single, true);
  one.parallel.zero_stage = 0;
  one.training.micro_batch = kGlobalBatch;
  Trainer reference(one, *self, quiet());
  const TrainedRun want = test::train_steps(reference, kSteps);
  expect_near_reference(want, reference, a, on, l.tp > 1 ? 1e-5 : 1e-6);
}

std::string zero_layout_name(const ::testing::TestParamInfo<ZeroOverlapLayout>& info) {
  return zero_name_of(info.param);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ZeroOverlap);
INSTANTIATE_TEST_SUITE_P(Layouts, ZeroOverlap, ::testing::ValuesIn(zero_layouts_of_this_world()),
                         zero_layout_name);

}  // namespace
}  // namespace meshtrain
