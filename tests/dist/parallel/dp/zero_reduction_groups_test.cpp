// ZeroSharding's reduction groups (issue 14, the placement step; one object since issue 40):
// dense parameters are reduced and ZeRO-sliced over dp × cp, experts' over the
// expert-data-parallel group (their sum divided by dp × cp), and the grad norm counts every
// logical element once — checked at every ZeRO stage on a world of dp = 2 or 4 with ep = 2, with
// synthetic parameters whose gradients are known functions of the rank. Reducing an expert over
// dp × cp (mixing two experts), dividing it by the edp size (× ep) or counting an expert's copy
// on every edp rank moves the gathered gradient or the norm far outside the tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dist_env.h"
#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/dp/zero.h"
#include "meshtrain/train/optimizer_state.h"

namespace meshtrain {
namespace {

constexpr std::int64_t kDense = 10, kExpert = 7;  // odd sizes: ZeRO slices are padded

// What rank r adds to element i of a gradient.
float grad_of(int rank, std::int64_t i) {
  return 0.5f * static_cast<float>(rank + 1) + 0.01f * static_cast<float>(i);
}

class ZeroReductionGroupsStage : public ::testing::TestWithParam<int> {};

TEST_P(ZeroReductionGroupsStage, ReducesEachParameterOverItsReplicaGroupAndCountsItOnce) {
  const int stage = GetParam();
  const auto world = test::runtime().world_group();
  const int dp = world->size();
  const MeshShape shape{.dp = dp, .ep = 2};
  const DeviceMesh mesh(shape, *world);
  const int ep_rank = mesh.group(Axis::ep).rank();
  Parameter dense("dense.weight", Shape{kDense}, InitKind::normal, 0.02f);
  // Each ep rank holds its own expert, named by its index (as an expert's weights are).
  Parameter expert("experts." + std::to_string(ep_rank) + ".weight", Shape{kExpert},
                   InitKind::normal, 0.02f);
  expert.placement.replicas = ReplicaGroup::expert;
  for (Parameter* p : {&dense, &expert}) p->placement.zero_stage = stage;  // as the table would
  initialize(dense, 7);
  initialize(expert, 7);
  const ParameterList params{&dense, &expert};
  const std::vector<ParameterList> units{params};
  ZeroSharding zero(
      params, units,
      [&mesh](ReplicaGroup g) {
        return ReductionGroup{replica_group(mesh, g), grad_reduction_group(mesh).size()};
      },
      ZeroOptions{.stage = stage,
                  .compute_dtype = DType::f32,
                  .bucket_bytes = 4 << 20,
                  .overlap_grad_reduce = false,
                  .microbatches = 1,
                  .seed = 7,
                  .initial_values = {}});

  zero.before_backward(units[0], nullptr);  // stages 2–3: the unit's full gradients exist now
  for (Parameter* p : params) {
    float* g = p->grad.f32();
    for (std::int64_t i = 0; i < p->grad.numel(); ++i) g[i] = grad_of(world->rank(), i);
  }
  zero.after_backward(units[0]);
  zero.reduce_gradients();

  // Dense: the mean over all dp ranks. Expert of ep rank e: the sum over its edp ranks d ≡ e
  // (mod 2) — an owner's gradient already holds its ep group's tokens — divided by dp × cp
  // (= dp here), not by the edp size (ReductionGroup::mean_over).
  const auto dense_value = [&](std::int64_t i) {
    double v = 0.0;
    for (int r = 0; r < dp; ++r) v += grad_of(r, i);
    return v / dp;
  };
  const auto expert_value = [&](int e, std::int64_t i) {
    double v = 0.0;
    for (int r = e; r < dp; r += 2) v += grad_of(r, i);
    return v / dp;
  };
  const Tensor dense_grad = zero.gather_grad(dense), expert_grad = zero.gather_grad(expert);
  for (std::int64_t i = 0; i < kDense; ++i) {
    EXPECT_NEAR(dense_grad.f32()[i], dense_value(i), 4e-6) << "dense " << i;
  }
  for (std::int64_t i = 0; i < kExpert; ++i) {
    EXPECT_NEAR(expert_grad.f32()[i], expert_value(ep_rank, i), 4e-6) << "expert " << i;
  }

  // The norm: the dense gradient once, and each of the 2 experts once.
  double want = 0.0;
  for (std::int64_t i = 0; i < kDense; ++i) want += std::pow(dense_value(i), 2);
  for (int e = 0; e < 2; ++e) {
    for (std::int64_t i = 0; i < kExpert; ++i) want += std::pow(expert_value(e, i), 2);
  }
  const double norm = global_grad_norm(zero.shards(), placement_groups(mesh));
  EXPECT_NEAR(norm, std::sqrt(want), 1e-6 * std::sqrt(want));
}

std::vector<int> stages_of_this_world() {
  const int world = test::launched_world_size();
  if (world != 2 && world != 4) return {};
  return {0, 1, 2, 3};
}

INSTANTIATE_TEST_SUITE_P(ZeroReductionGroups, ZeroReductionGroupsStage,
                         ::testing::ValuesIn(stages_of_this_world()),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return "zero" + std::to_string(p.param);
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ZeroReductionGroupsStage);

}  // namespace
}  // namespace meshtrain
