// The placement table (mesh/placement.h) over a set of layouts — dense and MoE, tied and
// untied embeddings, sequence parallel on and off, every ZeRO stage, pp with virtual stages,
// cp, ep × tp, a vocabulary tp does not divide — checked against its invariants on every world
// rank: the tp slices tile each logical tensor, ZeRO's ranges tile each local tensor once per
// reduction group, every logical element counts once in the grad norm, each tensor lives on
// the stage and ep rank that own it, the model each rank builds is exactly its part of the
// table, and the planner counts the same elements per stage.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <memory>
#include <ostream>

#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/mesh/placement.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/plan/accounting.h"
#include "meshtrain/transformer/parallel_groups.h"

namespace meshtrain {
namespace {

struct Layout {
  ModelFamily family;
  std::int64_t experts, pp, v, dp, cp, tp, ep;
  bool sp;
  std::int64_t zero;
  Precision precision = Precision::fp32;
};

std::string name_of(const Layout& l) {
  return fmt::format("{}{}_pp{}v{}_dp{}_cp{}_tp{}{}_ep{}_zero{}_{}",
                     l.family == ModelFamily::gpt2 ? "gpt2" : "llama",
                     l.experts > 0 ? fmt::format("moe{}", l.experts) : "", l.pp, l.v, l.dp, l.cp,
                     l.tp, l.sp ? "sp" : "", l.ep, l.zero, to_string(l.precision));
}

// GoogleTest prints a parameter in the test's description; without this, the struct's raw
// bytes (padding included) would appear in every CTest name.
void PrintTo(const Layout& l, std::ostream* out) { *out << name_of(l); }

Config config_of(const Layout& l) {
  Config c;
  c.source = "placement test";
  c.model.family = l.family;
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.model.n_kv_head = l.family == ModelFamily::llama ? 2 : 0;
  c.model.n_embd = 16;
  c.model.ffn_hidden = l.family == ModelFamily::llama ? 24 : 0;
  c.model.block_size = 16;
  c.model.vocab_size = 65;  // not divisible by tp 2 or 4: the last tp rank holds padding
  c.model.bias = l.family == ModelFamily::gpt2;
  c.model.moe_experts = l.experts;
  c.model.moe_ffn_hidden = l.experts > 0 ? 8 : 0;
  c.parallel.pp = l.pp;
  c.parallel.virtual_stages = l.v;
  c.parallel.pp_schedule = l.v > 1 ? PipelineSchedule::interleaved_1f1b
                                   : PipelineSchedule::one_f_one_b;
  c.parallel.dp = l.dp;
  c.parallel.cp = l.cp;
  c.parallel.tp = l.tp;
  c.parallel.ep = l.ep;
  c.parallel.sequence_parallel = l.sp;
  c.parallel.zero_stage = l.zero;
  c.training.precision = l.precision;
  c.training.micro_batch = 1;
  c.training.accumulation = 4;
  c.training.global_batch = 4 * l.dp;
  return c;
}

class PlacementTableLayouts : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    config_ = config_of(GetParam());
    const std::vector<ConfigIssue> issues =
        check_config(config_, static_cast<int>(GetParam().pp * GetParam().dp * GetParam().cp *
                                               GetParam().tp));
    ASSERT_TRUE(issues.empty()) << issues.front().setting << ": " << issues.front().rule;
  }
  Config config_;
};

TEST_P(PlacementTableLayouts, TpSlicesTileEveryLogicalTensor) {
  const PlacementTable table = placement_table(config_);
  const MeshShape& mesh = table.mesh();
  for (const ParamPlacement& p : table.params()) {
    std::vector<int> seen(static_cast<std::size_t>(shape_numel(p.shape)), 0);
    for (int t = 0; t < mesh.tp; ++t) {
      const ShardSlice s = p.tp_slice(t, mesh.tp);
      ASSERT_EQ(s.logical_shape, p.shape) << p.name;
      for (const ShardRun& run : runs_of(s)) {
        for (std::int64_t i = 0; i < run.count; ++i) ++seen[static_cast<std::size_t>(run.logical + i)];
      }
      if (!p.sharded_over_tp()) break;  // a replicated tensor: every tp rank holds all of it
    }
    for (std::size_t i = 0; i < seen.size(); ++i) {
      ASSERT_EQ(seen[i], 1) << p.name << " element " << i;
    }
  }
}

TEST_P(PlacementTableLayouts, EachTensorLivesOnItsStageAndEpRankAndNowhereElse) {
  const PlacementTable table = placement_table(config_);
  const MeshShape& mesh = table.mesh();
  const int last_stage = (static_cast<int>(config_.parallel.pp * config_.parallel.virtual_stages) - 1) %
                         mesh.pp;
  std::map<std::pair<std::string, bool>, int> holders;
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    for (const ParamPlacement* p : table.held_by(mesh.coords_of(rank))) {
      ++holders[{p->name, p->tied_copy}];
    }
  }
  for (const ParamPlacement& p : table.params()) {
    const bool expert = p.on(Axis::ep).kind == PlacementKind::owned;
    const int ranks_per_stage = mesh.world_size() / mesh.pp;
    EXPECT_EQ((holders[{p.name, p.tied_copy}]), ranks_per_stage / (expert ? mesh.ep : 1)) << p.name;
    if (p.tied_copy) {
      EXPECT_EQ(p.on(Axis::pp).owner, last_stage) << p.name;
    }
    if (p.name == "transformer.wte.weight" && !p.tied_copy) {
      EXPECT_EQ(p.on(Axis::pp).owner, 0);
    }
    EXPECT_EQ(p.replicas, expert && mesh.ep > 1 ? ReplicaGroup::expert : ReplicaGroup::dense)
        << p.name;
    // Sequence parallel sums exactly the tensors tp does not shard.
    EXPECT_EQ(p.sum_over_tp, GetParam().sp && mesh.tp > 1 && !p.sharded_over_tp()) << p.name;
  }
}

// Every reduction group (the replicas of one tensor: same pp and tp coordinates, and for an
// expert the same ep rank) splits the local tensor into disjoint ZeRO ranges that cover it;
// without ZeRO each holds all of it.
TEST_P(PlacementTableLayouts, ZeroRangesTileEachLocalTensorOncePerReductionGroup) {
  const PlacementTable table = placement_table(config_);
  const MeshShape& mesh = table.mesh();
  for (const ParamPlacement& p : table.params()) {
    std::map<std::tuple<int, int, int>, std::vector<std::pair<std::int64_t, std::int64_t>>> groups;
    std::int64_t numel = 0;
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      const MeshCoords c = mesh.coords_of(rank);
      if (!p.held_by(mesh, c)) continue;
      numel = shape_numel(p.local_shape(mesh, c));
      const int ep_rank = p.replicas == ReplicaGroup::expert ? c.dp % mesh.ep : 0;
      groups[{c.pp, c.tp, ep_rank}].push_back(p.zero_range(mesh, c));
    }
    for (auto& [key, ranges] : groups) {
      ASSERT_EQ(static_cast<int>(ranges.size()), replica_count(mesh, p.replicas)) << p.name;
      if (p.zero_stage == 0) {
        for (const auto& r : ranges) EXPECT_EQ(r, std::make_pair(std::int64_t{0}, numel)) << p.name;
        continue;
      }
      std::int64_t at = 0;
      for (const auto& [begin, end] : ranges) {  // replica order = rank order
        EXPECT_EQ(begin, at) << p.name;
        EXPECT_LE(begin, end) << p.name;
        at = end;
      }
      EXPECT_EQ(at, numel) << p.name;
    }
  }
}

// The grad norm, the found-inf check and the checkpoint count each logical element exactly
// once over the whole world (a tied copy never).
TEST_P(PlacementTableLayouts, EveryLogicalElementCountsOnceInTheNorm) {
  const PlacementTable table = placement_table(config_);
  const MeshShape& mesh = table.mesh();
  std::map<std::string, std::vector<int>> counted;
  for (const ParamPlacement& p : table.params()) {
    counted.try_emplace(p.name, static_cast<std::size_t>(shape_numel(p.shape)), 0);
  }
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    const MeshCoords c = mesh.coords_of(rank);
    for (const ParamPlacement* p : table.held_by(c)) {
      if (!p->counts_copy(placement_ranks(mesh, rank))) continue;
      const auto [begin, end] = p->zero_range(mesh, c);
      for (const ShardRun& run : runs_of(p->slice(mesh, c))) {
        for (std::int64_t i = std::max(begin, run.local); i < std::min(end, run.local + run.count);
             ++i) {
          ++counted[p->name][static_cast<std::size_t>(run.logical + i - run.local)];
        }
      }
    }
  }
  for (const auto& [name, counts] : counted) {
    for (std::size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(counts[i], 1) << name << " " << i;
  }
}

// Every rank's pipeline stage builds exactly its part of the table (its layers allocate each
// parameter from its record; PipelineStage::check_built MT_CHECKs names and order) and
// carries each record.
TEST_P(PlacementTableLayouts, TheModelEachRankBuildsIsItsPartOfTheTable) {
  const PlacementTable table = placement_table(config_);
  const MeshShape& mesh = table.mesh();
  for (int pp = 0; pp < mesh.pp; ++pp) {
    for (int tp = 0; tp < mesh.tp; ++tp) {
      for (int ep = 0; ep < mesh.ep; ++ep) {
        const auto tp_group = detached_group(tp, mesh.tp, "tp");
        const auto ep_group = detached_group(ep, mesh.ep, "ep");
        const ParallelGroups groups(TensorParallel{*tp_group, config_.parallel.sequence_parallel},
                                    ContextParallel{}, ExpertParallel{ep_group.get()});
        std::unique_ptr<PipelineStage> stage;
        ASSERT_NO_THROW(stage = std::make_unique<PipelineStage>(config_, 1, groups, pp,
                                                                ParameterStorage::deferred));
        const MeshCoords c{.pp = pp, .dp = ep, .cp = 0, .tp = tp};
        const std::vector<const ParamPlacement*> held = table.held_by(c);
        ASSERT_EQ(stage->parameters().size(), held.size());
        for (std::size_t i = 0; i < held.size(); ++i) {
          const Parameter& p = *stage->parameters()[i];
          EXPECT_EQ(p.placement.name, held[i]->name);
          EXPECT_EQ(p.placement.tied_copy, held[i]->tied_copy);
          EXPECT_EQ(p.placement.replicas, held[i]->replicas);
          EXPECT_EQ(p.placement.zero_stage, GetParam().zero);
          EXPECT_EQ(p.local_shape(), held[i]->local_shape(mesh, c)) << p.name;
        }
      }
    }
  }
}

// The planner's Ψ of each stage (plan/accounting.h) is the table's elements on one rank.
TEST_P(PlacementTableLayouts, ThePlannerCountsTheTablesElements) {
  const PlacementTable table = placement_table(config_);
  const MeshShape& mesh = table.mesh();
  for (int s = 0; s < mesh.pp; ++s) {
    const MeshCoords c{.pp = s, .dp = 0, .cp = 0, .tp = 0};
    double elements = 0.0;
    for (const ParamPlacement* p : table.held_by(c)) {
      elements += static_cast<double>(shape_numel(p->local_shape(mesh, c)));
    }
    EXPECT_EQ(plan::stage_parameters(config_, s).total, elements) << "stage " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PlacementTableLayouts,
    ::testing::Values(
        Layout{ModelFamily::gpt2, 0, 1, 1, 2, 1, 2, 1, false, 0},
        Layout{ModelFamily::gpt2, 0, 2, 1, 2, 1, 2, 1, true, 1},
        Layout{ModelFamily::gpt2, 0, 4, 1, 1, 1, 1, 1, false, 2},
        Layout{ModelFamily::gpt2, 0, 2, 2, 2, 2, 1, 1, false, 3, Precision::bf16},
        Layout{ModelFamily::gpt2, 0, 1, 1, 1, 1, 4, 1, true, 0},
        Layout{ModelFamily::llama, 0, 2, 1, 2, 1, 2, 1, true, 3},
        Layout{ModelFamily::llama, 0, 1, 1, 2, 2, 2, 1, false, 1, Precision::fp16},
        Layout{ModelFamily::llama, 4, 1, 1, 4, 1, 2, 2, true, 1},
        Layout{ModelFamily::llama, 4, 1, 1, 2, 1, 1, 2, false, 0},
        Layout{ModelFamily::llama, 4, 2, 1, 2, 2, 1, 2, false, 2, Precision::bf16},
        Layout{ModelFamily::llama, 4, 1, 1, 2, 1, 1, 1, false, 3}),
    [](const ::testing::TestParamInfo<Layout>& layout) { return name_of(layout.param); });

TEST(PlacementTable, APrintedAxisNamesItsKindDimAndPart) {
  EXPECT_EQ(to_string(AxisPlacement{}), "replicate");
  EXPECT_EQ(to_string(AxisPlacement{.kind = PlacementKind::shard, .dim = 1}), "shard(1)");
  EXPECT_EQ(to_string(AxisPlacement{.kind = PlacementKind::shard, .dim = 0, .parts = 3}),
            "shard(0, 3 parts)");
  EXPECT_EQ(to_string(AxisPlacement{.kind = PlacementKind::owned, .owner = 2}), "owned(2)");
}

}  // namespace
}  // namespace meshtrain
