// The MoE dispatch rules of transformer/moe_routing.h on hand-computed routings: the capacity
// formula (Switch Transformer §2.2 eq. 3 with Megatron-LM's top-k token count), which
// assignments each drop policy keeps (ties by token order), the packed row order (by expert,
// token order within an expert, whatever the policy) and the counts before and after dropping.
#include <gtest/gtest.h>

#include <vector>

#include "meshtrain/transformer/moe_routing.h"

namespace meshtrain {
namespace {

using Rows = std::vector<std::int32_t>;
using Counts = std::vector<std::int64_t>;

MoeDispatch plan(const Rows& experts, const std::vector<float>& weights, std::int64_t tokens,
                 std::int64_t k, std::int64_t E, std::optional<std::int64_t> capacity,
                 MoeDropPolicy policy) {
  return plan_moe_dispatch(experts, weights, tokens, k, E, capacity, policy);
}

TEST(MoeRouting, CapacityIsCeilOfFactorTimesAssignmentsPerExpert) {
  EXPECT_EQ(moe_expert_capacity(10, 2, 4, 1.0), 5);    // 10·2/4 = 5
  EXPECT_EQ(moe_expert_capacity(10, 2, 4, 1.25), 7);   // ⌈6.25⌉
  EXPECT_EQ(moe_expert_capacity(7, 1, 3, 1.0), 3);     // ⌈2.33⌉
  EXPECT_EQ(moe_expert_capacity(16, 2, 8, 0.5), 2);    // 4 · 0.5
  EXPECT_EQ(moe_expert_capacity(3, 1, 8, 0.01), 1);    // ⌈0.0038⌉: never 0 for a token
  EXPECT_EQ(moe_expert_capacity(0, 2, 4, 1.0), 0);
  EXPECT_FALSE(moe_expert_capacity(10, 2, 4, 0.0).has_value());  // dropless
  EXPECT_DEATH(moe_expert_capacity(10, 2, 4, -1.0), "capacity_factor=-1");
}

TEST(MoeRouting, DroplessPacksRowsByExpertInTokenOrder) {
  const MoeDispatch d =
      plan({1, 0, 1, 0}, {1, 1, 1, 1}, 4, 1, 2, std::nullopt, MoeDropPolicy::probs);
  EXPECT_EQ(d.counts, (Counts{2, 2}));
  EXPECT_EQ(d.routed, (Counts{2, 2}));
  EXPECT_EQ(d.offsets, (Counts{0, 2, 4}));
  EXPECT_EQ(d.row_token, (Rows{1, 3, 0, 2}));
  EXPECT_EQ(d.assign_row, (Rows{2, 0, 3, 1}));
  EXPECT_EQ(d.dropped(), 0);
}

// Top-1, expert 0 over-full (3 tokens for capacity 2).
TEST(MoeRouting, ProbsPolicyKeepsTheHighestWeights) {
  const MoeDispatch d =
      plan({0, 0, 0, 1}, {0.5f, 0.9f, 0.7f, 1.0f}, 4, 1, 2, 2, MoeDropPolicy::probs);
  EXPECT_EQ(d.routed, (Counts{3, 1}));
  EXPECT_EQ(d.counts, (Counts{2, 1}));
  EXPECT_EQ(d.assign_row, (Rows{-1, 0, 1, 2}));  // token 0 (0.5) dropped
  EXPECT_EQ(d.row_token, (Rows{1, 2, 3}));       // kept rows stay in token order
  EXPECT_EQ(d.dropped(), 1);
}

TEST(MoeRouting, PositionPolicyKeepsTheEarliestTokens) {
  const MoeDispatch d =
      plan({0, 0, 0, 1}, {0.5f, 0.9f, 0.7f, 1.0f}, 4, 1, 2, 2, MoeDropPolicy::position);
  EXPECT_EQ(d.assign_row, (Rows{0, 1, -1, 2}));  // token 2 dropped
  EXPECT_EQ(d.row_token, (Rows{0, 1, 3}));
}

TEST(MoeRouting, ProbsPolicyBreaksTiesByTokenOrder) {
  const MoeDispatch d =
      plan({0, 0, 0, 0}, {0.6f, 0.6f, 0.8f, 0.6f}, 4, 1, 1, 2, MoeDropPolicy::probs);
  EXPECT_EQ(d.assign_row, (Rows{0, -1, 1, -1}));  // 0.8, then the earliest 0.6
}

// Top-2 over 3 experts, capacity 1. Assignments a = n·2 + j:
//   expert 0: a0 (token 0, 0.6), a3 (token 1, 0.3)
//   expert 1: a1 (token 0, 0.4), a2 (token 1, 0.7), a4 (token 2, 0.55)
//   expert 2: a5 (token 2, 0.45)
TEST(MoeRouting, TopTwoDropsPerExpertUnderBothPolicies) {
  const Rows experts{0, 1, 1, 0, 1, 2};
  const std::vector<float> weights{0.6f, 0.4f, 0.7f, 0.3f, 0.55f, 0.45f};
  const MoeDispatch by_probs = plan(experts, weights, 3, 2, 3, 1, MoeDropPolicy::probs);
  EXPECT_EQ(by_probs.routed, (Counts{2, 3, 1}));  // before dropping: what the aux loss counts
  EXPECT_EQ(by_probs.counts, (Counts{1, 1, 1}));
  EXPECT_EQ(by_probs.assign_row, (Rows{0, -1, 1, -1, -1, 2}));
  EXPECT_EQ(by_probs.row_token, (Rows{0, 1, 2}));
  EXPECT_EQ(by_probs.dropped(), 3);
  const MoeDispatch by_position = plan(experts, weights, 3, 2, 3, 1, MoeDropPolicy::position);
  EXPECT_EQ(by_position.assign_row, (Rows{0, 1, -1, -1, -1, 2}));
  EXPECT_EQ(by_position.row_token, (Rows{0, 0, 2}));
}

TEST(MoeRoutingDeathTest, RejectsBadRoutings) {
  // Broken invariants of the layer (MT_CHECK): the config rejects top_k > E first.
  EXPECT_DEATH(plan({0, 3}, {1, 1}, 2, 1, 3, std::nullopt, MoeDropPolicy::probs),
               "assignment 1 names expert 3 of 3");
  EXPECT_DEATH(plan({0}, {1, 1}, 2, 1, 3, std::nullopt, MoeDropPolicy::probs),
               "1 experts and 2 weights");
  EXPECT_DEATH(plan({0, 1}, {1, 1}, 1, 2, 1, std::nullopt, MoeDropPolicy::probs),
               "top_k=2 experts=1");
}

TEST(MoeRouting, DropPolicyNames) {
  EXPECT_EQ(parse_enum<MoeDropPolicy>("probs"), MoeDropPolicy::probs);
  EXPECT_EQ(parse_enum<MoeDropPolicy>("position"), MoeDropPolicy::position);
  EXPECT_FALSE(parse_enum<MoeDropPolicy>("prob").has_value());
  EXPECT_EQ(to_string(MoeDropPolicy::position), "position");
}

// Uniform router probabilities: load balance E·Σ fᵢPᵢ = Σ fᵢ = 1 whatever the counts; z-loss
// (1/N)·Σ lse².
TEST(MoeRouting, RouterLossesOfHandValues) {
  const std::vector<float> probs(3 * 4, 0.25f);
  const std::vector<float> lse{1.0f, 2.0f, 3.0f};
  // 3 tokens, top-2 → experts 0 and 1. Not written `Counts{3, 3, 0, 0}`: GCC 12.2 with
  // -mavx512f (our -march=native) stores that constant as one vpbroadcastq of 3, i.e. {3, 3, 3,
  // 3} (wrong code, seen Dec 2026; -fno-tree-slp-vectorize avoids it).
  Counts routed(4, 0);
  routed[0] = routed[1] = 3;
  const MoeRouterLosses l = moe_router_losses(probs.data(), lse.data(), routed, 3, 2, 0.1, 0.01);
  EXPECT_DOUBLE_EQ(l.load_balance, 1.0);
  EXPECT_NEAR(l.aux_loss, 0.1, 1e-12);
  EXPECT_NEAR(l.router_z, 14.0 / 3.0, 1e-12);
  EXPECT_NEAR(l.z_loss, 0.14 / 3.0, 1e-12);
  // ∂aux/∂p[n, i] = coeff·E·fᵢ/N: f = (½, ½, 0, 0).
  ASSERT_EQ(l.aux_dprob.size(), 4U);
  EXPECT_NEAR(l.aux_dprob[0], 0.1 * 4 * 0.5 / 3, 1e-8);
  EXPECT_EQ(l.aux_dprob[3], 0.0f);
  EXPECT_NEAR(l.z_scale, 2 * 0.01 / 3, 1e-9);
  // Skewed probabilities: P = (0.7, 0.1, 0.1, 0.1), f = (1, 0, 0, 0) at top-1 → 4·0.7.
  const std::vector<float> skew{0.7f, 0.1f, 0.1f, 0.1f, 0.7f, 0.1f, 0.1f, 0.1f};
  const MoeRouterLosses s = moe_router_losses(skew.data(), lse.data(), Counts{2, 0, 0, 0}, 2, 1,
                                              1.0, 0.0);
  EXPECT_NEAR(s.load_balance, 2.8, 1e-6);
  EXPECT_EQ(s.z_loss, 0.0);
}

}  // namespace
}  // namespace meshtrain
