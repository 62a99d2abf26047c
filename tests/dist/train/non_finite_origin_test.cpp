// Issue 17 item 8: a non-finite value is blamed where it first appeared, not where it was seen
// after the collectives spread it (docs/resilience.md, "Non-finite values").
//   NonFiniteGradOrigin  an inf written into one rank's local gradient of a late parameter,
//                        right after the backward that completes it and before the model's
//                        hooks hand it to the reductions (where an overflow in that rank's
//                        backward puts it): the non-finite grad norm names that rank, the
//                        step, the layer, the tensor and the reduction it was about to enter —
//                        not rank 0, which holds it too after the dp all-reduce, the tied
//                        embedding's sum over pp or the sequence-parallel sum over tp.
//   NonFiniteLossOrigin  a NaN written into tp rank 1's shard of a mid-model weight (its fp32
//                        master, or its bf16 compute copy): the non-finite loss names that rank,
//                        the step, the layer and the tensor, though the tp all-reduces of the
//                        forward made every rank's loss NaN; a huge but finite weight instead
//                        (an activation overflow) is reported as such, with every weight finite.
// Every rank throws the same message, and none hangs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "meshtrain/core/half.h"

namespace meshtrain {
namespace {

// Rank 0's `text` on every rank.
std::string rank0_text(ProcessGroup& world, std::string text) {
  std::int64_t length = static_cast<std::int64_t>(text.size());
  world.broadcast(std::as_writable_bytes(std::span<std::int64_t>(&length, 1)), 0);
  text.resize(static_cast<std::size_t>(length));
  world.broadcast(std::as_writable_bytes(std::span<char>(text)), 0);
  return text;
}

// Checks `what` on this rank and that every rank threw the same message.
void expect_same_everywhere(ProcessGroup& world, const std::string& what) {
  EXPECT_EQ(rank0_text(world, what), what) << "rank " << world.rank() << " threw another message";
}

void expect_has(const std::string& what, const std::string& part) {
  EXPECT_NE(what.find(part), std::string::npos) << "missing \"" << part << "\" in: " << what;
}

// Delegates to the model's hooks (ZeRO's); when armed, writes `value` into element `element` of
// `tensor`'s gradient on this rank after the backward that completes it, once, before the
// hooks pass it on to its reduction.
class LocalGradientFault final : public ParameterHooks {
 public:
  LocalGradientFault(ParameterHooks& inner, std::string tensor, std::int64_t element)
      : inner_(inner), tensor_(std::move(tensor)), element_(element) {}
  void arm() { armed_ = true; }
  bool fired() const { return fired_; }

  void before_forward(const ParameterList& unit, const ParameterList* next) override {
    inner_.before_forward(unit, next);
  }
  void after_forward(const ParameterList& unit) override { inner_.after_forward(unit); }
  void before_backward(const ParameterList& unit, const ParameterList* next) override {
    inner_.before_backward(unit, next);
  }
  void after_backward(const ParameterList& unit) override {
    for (Parameter* p : unit) {
      if (armed_ && !fired_ && p->name == tensor_) {
        p->grad.f32()[element_] = std::numeric_limits<float>::infinity();
        fired_ = true;
      }
    }
    inner_.after_backward(unit);
  }

 private:
  ParameterHooks& inner_;
  std::string tensor_;
  std::int64_t element_;
  bool armed_ = false;
  bool fired_ = false;
};

struct GradCase {
  const char* name;
  std::int64_t dp = 1, tp = 1, pp = 1;
  int zero = 0;
  bool overlap = false;
  bool sequence_parallel = false;
  const char* tensor;             // gets the inf, on world rank 1
  const char* layer = "layer 1";  // as the message names it
  const char* before;             // the reduction it names, e.g. "the all-reduce over dp"
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

std::vector<GradCase> grad_cases() {
  if (test::launched_world_size() != 2) return {};
  const char* late = "transformer.h.1.mlp.c_fc.weight";  // neither first in order nor in buckets
  return {
      {.name = "dp2", .dp = 2, .tensor = late, .before = "the all-reduce over dp"},
      {.name = "dp2_overlap",
       .dp = 2,
       .overlap = true,
       .tensor = late,
       .before = "the all-reduce over dp"},
      {.name = "dp2_zero1",
       .dp = 2,
       .zero = 1,
       .tensor = late,
       .before = "the reduce-scatter over dp"},
      {.name = "dp2_zero2_overlap",
       .dp = 2,
       .zero = 2,
       .overlap = true,
       .tensor = late,
       .before = "the reduce-scatter over dp"},
      // The last stage's copy of the tied embedding (the LM head), summed with the first's.
      {.name = "pp2_tied",
       .pp = 2,
       .tensor = "transformer.wte.weight",
       .layer = "module transformer.wte",
       .before = "the sum of the tied embedding's copies over embedding{0,1}"},
      // A norm weight replicated over tp: each tp rank holds a partial sum over its tokens.
      {.name = "tp2_sp",
       .tp = 2,
       .sequence_parallel = true,
       .tensor = "transformer.h.1.ln_2.weight",
       .before = "the sequence-parallel sum over tp"},
  };
}

class NonFiniteGradOrigin : public ::testing::TestWithParam<GradCase> {};

TEST_P(NonFiniteGradOrigin, NamesTheRankAndTensorWhereItFirstAppeared) {
  const GradCase& gc = GetParam();
  const auto world = test::runtime().world_group();
  Config c = test::small_tp_config(ModelFamily::gpt2, gc.dp, gc.tp, gc.sequence_parallel, 2, 2);
  c.parallel.pp = gc.pp;
  c.parallel.zero_stage = gc.zero;
  c.parallel.overlap_grad_reduce = gc.overlap;
  Trainer trainer(c, *world, test::quiet());
  LocalGradientFault fault(trainer.zero(), gc.tensor, 3);
  trainer.stage().set_hooks(&fault);
  for (int s = 0; s < 2; ++s) {
    const Trainer::Gradients g = trainer.compute_gradients(s);
    trainer.apply_update(s, g.grad_norm);
  }
  if (world->rank() == 1) fault.arm();
  try {
    trainer.compute_gradients(2);
    ADD_FAILURE() << "an inf gradient passed";
  } catch (const TrainingDiverged& e) {
    const std::string what = e.what();
    expect_has(what, "non-finite gradient norm inf at step 3");
    expect_has(what, "it first appeared on rank 1 (");
    expect_has(what, fmt::format("step 3, {}, tensor {}'s gradient [element 3 of this rank's "
                                 "shard] = inf, before {}",
                                 gc.layer, gc.tensor, gc.before));
    EXPECT_EQ(what.find("rank 0 ("), std::string::npos) << "rank 0 blamed: " << what;
    expect_same_everywhere(*world, what);
    if (world->rank() == 0) std::printf("%s: %s\n", gc.name, what.c_str());
  }
  EXPECT_EQ(fault.fired(), world->rank() == 1);
  trainer.stage().set_hooks(&trainer.zero());
}

std::string grad_case_name(const ::testing::TestParamInfo<GradCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, NonFiniteGradOrigin, ::testing::ValuesIn(grad_cases()),
                         grad_case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(NonFiniteGradOrigin);

struct LossCase {
  const char* name;
  Precision precision = Precision::fp32;
  float value = 0.0f;                 // written into tp rank 1's weight
  std::vector<std::string> expected;  // parts of the message
};

void PrintTo(const LossCase& c, std::ostream* os) { *os << c.name; }

std::vector<LossCase> loss_cases() {
  if (test::launched_world_size() != 2) return {};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {
      {.name = "tp2_nan_master",
       .value = nan,
       .expected = {"non-finite loss nan at step 3; first non-finite value: rank 1 (pp=0 dp=0 "
                    "cp=0 tp=1) weight transformer.h.1.mlp.c_fc.weight (layer 1), fp32 master "
                    "[element 7 of this rank's shard] = nan — "}},
      {.name = "tp2_bf16_nan_copy",
       .precision = Precision::bf16,
       .value = nan,
       .expected = {"non-finite loss nan at step 3; first non-finite value: rank 1 (pp=0 dp=0 "
                    "cp=0 tp=1) weight transformer.h.1.mlp.c_fc.weight (layer 1), bf16 compute "
                    "copy [element 7 of this rank's shard] = nan — "}},
      // Finite, but every activation after it overflows: the weights are not to blame.
      {.name = "tp2_activation_overflow",
       .value = 3e38f,
       .expected = {"at step 3; every rank's weights are finite; the local loss was non-finite "
                    "on rank 0 (pp=0 dp=0 cp=0 tp=0) local loss ",
                    "; rank 1 (pp=0 dp=0 cp=0 tp=1) local loss ",
                    ": the data or an activation overflow is to blame"}},
  };
}

class NonFiniteLossOrigin : public ::testing::TestWithParam<LossCase> {};

TEST_P(NonFiniteLossOrigin, NamesTheRankAndWeightOrSaysTheWeightsAreFinite) {
  const LossCase& lc = GetParam();
  const auto world = test::runtime().world_group();
  Config c = test::small_tp_config(ModelFamily::gpt2, 1, 2, false, 2, 1);
  c.model.n_layer = 3;
  c.training.precision = lc.precision;
  Trainer trainer(c, *world, test::quiet());
  for (int s = 0; s < 2; ++s) {
    const Trainer::Gradients g = trainer.compute_gradients(s);
    trainer.apply_update(s, g.grad_norm);
  }
  if (world->rank() == 1) {
    for (Parameter* p : trainer.parameters()) {
      if (p->name != "transformer.h.1.mlp.c_fc.weight") continue;
      if (p->value.dtype() == DType::f32) {
        p->value.f32()[7] = lc.value;  // the master itself (fp32, ZeRO 0)
      } else {
        p->value.u16()[7] = f32_to_bf16(lc.value);  // the copy the layers compute with
      }
    }
  }
  try {
    trainer.compute_gradients(2);
    ADD_FAILURE() << "a non-finite loss passed";
  } catch (const TrainingDiverged& e) {
    const std::string what = e.what();
    for (const std::string& part : lc.expected) expect_has(what, part);
    expect_same_everywhere(*world, what);
    if (world->rank() == 0) std::printf("%s: %s\n", lc.name, what.c_str());
  }
}

std::string loss_case_name(const ::testing::TestParamInfo<LossCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, NonFiniteLossOrigin, ::testing::ValuesIn(loss_cases()),
                         loss_case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(NonFiniteLossOrigin);

}  // namespace
}  // namespace meshtrain
