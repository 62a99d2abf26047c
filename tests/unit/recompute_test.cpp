// Activation recompute (training.recompute = "full"): each block keeps only its input and
// recomputes its forward in backward. The recomputed forward repeats the same arithmetic, so
// losses and gradients are bitwise those without recompute (issue 5), while the activation
// peak of a step falls. One process, both families.
#include <gtest/gtest.h>

#include <cstring>

#include "../support/test_config.h"
#include "../support/training_run.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/core/allocator.h"

namespace meshtrain {
namespace {

struct Measured {
  test::TrainedRun run;
  std::vector<Tensor> weights;  // after the steps
  std::int64_t activation_peak = 0;
};

Measured train(const std::string& family, const std::string& recompute) {
  const auto world = single_rank_group("world");
  Config c = test::small_tp_config(family, 1, 1, false, 4, 2);
  c.model.n_layer = 4;
  c.training.recompute = recompute;
  Trainer trainer(c, *world, test::quiet());
  TrackedAllocator& alloc = TrackedAllocator::instance();
  alloc.reset_peaks();
  const std::int64_t before = alloc.stats(MemCategory::activations).current_bytes;
  Measured m;
  m.run = test::train_steps(trainer, 5);
  m.activation_peak = alloc.stats(MemCategory::activations).peak_bytes - before;
  for (const Parameter* p : trainer.parameters()) {
    m.weights.push_back(p->value.clone(MemCategory::other));
  }
  return m;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.f32(), b.f32(), static_cast<std::size_t>(a.bytes())) == 0;
}

void expect_full_is_bitwise_none_with_a_lower_activation_peak(const std::string& family) {
  const Measured none = train(family, "none");
  const Measured full = train(family, "full");
  ASSERT_EQ(none.run.losses.size(), full.run.losses.size());
  for (std::size_t s = 0; s < none.run.losses.size(); ++s) {
    EXPECT_EQ(none.run.losses[s], full.run.losses[s]) << "step " << s + 1;
  }
  EXPECT_EQ(none.run.grad_norm_step1, full.run.grad_norm_step1);
  for (std::size_t i = 0; i < none.run.grads_step1.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(none.run.grads_step1[i], full.run.grads_step1[i])) << "grad " << i;
    EXPECT_TRUE(bitwise_equal(none.weights[i], full.weights[i])) << "weight " << i;
  }
  // 4 blocks: without recompute all their activations are alive at the end of the forward;
  // with it only the block inputs and one block's activations at a time.
  EXPECT_LT(full.activation_peak, none.activation_peak * 3 / 4)
      << "none " << none.activation_peak << " B, full " << full.activation_peak << " B";
  std::printf("%s activation peak: none %lld B, full %lld B\n", family.c_str(),
              static_cast<long long>(none.activation_peak),
              static_cast<long long>(full.activation_peak));
}

TEST(Recompute, FullIsBitwiseNoneWithALowerActivationPeakGpt2) {
  expect_full_is_bitwise_none_with_a_lower_activation_peak("gpt2");
}

TEST(Recompute, FullIsBitwiseNoneWithALowerActivationPeakLlama) {
  expect_full_is_bitwise_none_with_a_lower_activation_peak("llama");
}

}  // namespace
}  // namespace meshtrain
