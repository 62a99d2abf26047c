// SparseMoeBlock under expert parallel (issue 14 item 3) against the same layer on one rank:
// every rank of ep = world (2 or 4) routes its own tokens, the experts live on their owners,
// and the exchange (parallel/ep/expert_parallel.h) must give each rank exactly the one-rank layer's
// output and input gradient on its tokens, the router gradient of its tokens, and on each
// expert's owner the sum over all ranks' tokens of that expert's gradient — dropless and with
// capacity dropping (each rank drops among its own tokens, as the one-rank layer does on the
// same token set), with a skewed router that sends most tokens to expert 0. Also the ep
// all-to-all bytes against the formula from the exchanged counts.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "dist_env.h"
#include "support/placements.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/mesh/placement.h"
#include "meshtrain/transformer/moe.h"

namespace meshtrain {
namespace {

constexpr std::int64_t kC = 16, kF = 24, kE = 8, kTopK = 2, kTokens = 20;
// fp32: the owner sums the ranks' row contributions in a different order than the per-rank
// reference sum (≈1e-7 relative); a lost or doubled row, or a row at the wrong expert, is O(1).
constexpr double kRtol = 2e-6;

Tensor tokens_of(int rank, bool skewed) {
  Tensor x = Tensor::empty({kTokens, kC}, MemCategory::activations);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.f32()[i] = 0.5f * std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank));
    if (skewed && i % kC == 0) x.f32()[i] += 3.0f;  // feature 0 large: see skew_router
  }
  return x;
}

// Router row 0 (expert 0) gains a large weight on feature 0, so most tokens pick expert 0.
void skew_router(SparseMoeBlock& layer) {
  Parameter& gate = *layer.parameters().front();
  gate.value.f32()[0] += 2.0f;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(double(t.f32()[i])));
  return m;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double tol = kRtol * std::max(1.0, max_abs(want));
  double worst = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    worst = std::max(worst, std::abs(double(got.f32()[i]) - double(want.f32()[i])));
  }
  EXPECT_LE(worst, tol) << what;
}

struct EpCase {
  double capacity_factor;
  bool skewed;
};

class MoeExpertParallel : public ::testing::TestWithParam<EpCase> {};

TEST_P(MoeExpertParallel, EachRankGetsTheOneRankLayerOnItsTokens) {
  const EpCase c = GetParam();
  const auto world = test::runtime().world_group();
  const int ep = world->size(), me = world->rank();
  const MoeShape shape{.n_embd = kC,
                       .moe_experts = kE,
                       .moe_top_k = kTopK,
                       .moe_ffn_hidden = kF,
                       .init_std = 0.2f,
                       .proj_init_std = 0.2f};
  const MoeOptions options{.moe_capacity_factor = c.capacity_factor,
                           .moe_token_drop_policy = MoeDropPolicy::probs,
                           .moe_aux_loss_coeff = 0.01,
                           .moe_z_loss_coeff = 0.001};
  SparseMoeBlock parallel("model.layers.0", shape, options,
                          test::records_table({test::moe_records("model.layers.0", kE, kC, kF, ep)}),
                          ExpertParallel{world.get()});
  SparseMoeBlock single("model.layers.0", shape, options,
                        test::records_table({test::moe_records("model.layers.0", kE, kC, kF)}));
  for (Parameter* p : parallel.parameters()) initialize(*p, 5);
  for (Parameter* p : single.parameters()) initialize(*p, 5);
  if (c.skewed) {
    skew_router(parallel);
    skew_router(single);
  }
  ASSERT_EQ(parallel.parameters().size(), 1 + 3 * static_cast<std::size_t>(kE / ep));

  const SequenceBatch batch{1, kTokens};
  const Tensor x = tokens_of(me, c.skewed);
  Tensor dy = tokens_of(me + 100, false);
  world->reset_counters();
  const Tensor y = parallel.forward(x, batch, {});
  const std::int64_t forward_bytes = world->counter(CommOp::all_to_all).bytes;
  const Tensor dx = parallel.backward(dy, {});
  const std::int64_t backward_bytes = world->counter(CommOp::all_to_all).bytes - forward_bytes;

  // The reference: the one-rank layer on each rank's tokens in turn; its expert gradients
  // accumulate over all of them (what the owner's experts see), its router gradient is kept
  // per rank.
  std::map<std::string, Tensor> expert_grad_sum;
  Tensor my_router_grad;
  std::int64_t my_rows = 0, to_my_experts = 0;
  const std::int64_t L = kE / ep;
  for (int r = 0; r < ep; ++r) {
    for (Parameter* p : single.parameters()) p->grad.fill(0.0f);
    const Tensor ry = single.forward(tokens_of(r, c.skewed), batch, {});
    const Tensor rdx = single.backward(tokens_of(r + 100, false), {});
    for (std::int64_t e = me * L; e < (me + 1) * L; ++e) {
      to_my_experts += single.stats().tokens_per_expert[static_cast<std::size_t>(e)];
    }
    if (r == me) {
      expect_close(y, ry, "output");
      expect_close(dx, rdx, "input gradient");
      my_router_grad = single.parameters().front()->grad.clone(MemCategory::other);
      my_rows = single.stats().tokens * kTopK - single.stats().dropped;
      EXPECT_EQ(parallel.stats().dropped, single.stats().dropped);
    }
    for (Parameter* p : single.parameters()) {
      auto [it, added] = expert_grad_sum.try_emplace(p->name, p->grad.clone(MemCategory::other));
      if (!added) {
        for (std::int64_t i = 0; i < p->grad.numel(); ++i) it->second.f32()[i] += p->grad.f32()[i];
      }
    }
  }
  const ParameterList mine = parallel.parameters();
  expect_close(mine.front()->grad, my_router_grad, "router gradient (this rank's tokens)");
  // The placement table of this layer as block 0 of a Llama MoE on dp = ep = world: each of
  // this rank's experts is owned by it over ep and reduced over the expert group.
  ModelConfig model;
  model.family = ModelFamily::llama;
  model.n_layer = 1;
  model.n_head = 1;
  model.n_embd = kC;
  model.vocab_size = 8;
  model.bias = false;
  model.moe_experts = kE;
  model.moe_top_k = kTopK;
  model.moe_ffn_hidden = kF;
  const PlacementTable table =
      placement_table(model, {.mesh = {.dp = ep, .ep = ep}, .layers_per_chunk = {1}});
  for (std::size_t i = 1; i < mine.size(); ++i) {
    const ParamPlacement& placed = table.at(mine[i]->name);
    EXPECT_EQ(placed.replicas, ReplicaGroup::expert) << mine[i]->name;
    EXPECT_EQ(placed.on(Axis::ep).owner, me) << mine[i]->name;
    EXPECT_EQ(placed.shape, mine[i]->shard.logical_shape) << mine[i]->name;
    expect_close(mine[i]->grad, expert_grad_sum.at(mine[i]->name), mine[i]->name);
  }
  // Bytes (docs/moe.md, counted as each rank's input): the E counts, the rows this rank sends
  // (its kept assignments) and, in the combine, the rows its experts received, C floats each.
  EXPECT_EQ(forward_bytes,
            static_cast<std::int64_t>((kE + (my_rows + to_my_experts) * kC) * sizeof(float)));
  // Backward moves the same rows again (the output gradient out, the input gradient back),
  // without a count exchange.
  EXPECT_EQ(backward_bytes,
            static_cast<std::int64_t>((my_rows + to_my_experts) * kC * sizeof(float)));
}

std::vector<EpCase> cases_of_this_world() {
  const int world = test::launched_world_size();
  if (world != 2 && world != 4) return {};
  return {{0.0, false}, {0.0, true}, {1.0, true}, {1.25, false}};
}

INSTANTIATE_TEST_SUITE_P(Ep, MoeExpertParallel, ::testing::ValuesIn(cases_of_this_world()),
                         [](const ::testing::TestParamInfo<EpCase>& p) {
                           return std::string(p.param.capacity_factor == 0 ? "dropless"
                                                                           : "capacity") +
                                  (p.param.capacity_factor == 1.25  ? "1_25"
                                   : p.param.capacity_factor == 1.0 ? "1"
                                                                    : "") +
                                  (p.param.skewed ? "_skewed" : "");
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MoeExpertParallel);

}  // namespace
}  // namespace meshtrain
