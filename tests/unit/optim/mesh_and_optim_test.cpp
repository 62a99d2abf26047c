// Pure parts of comm/ and optim/: the mesh formula as a property over a table of shapes, and
// the LR schedule and clipping rules against hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numbers>
#include <set>

#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/optim/adamw.h"

namespace meshtrain {
namespace {

bool partitions_world(const std::vector<std::vector<int>>& groups, int world) {
  std::set<int> seen;
  for (const auto& g : groups) {
    for (int r : g) {
      if (!seen.insert(r).second) return false;
    }
  }
  return static_cast<int>(seen.size()) == world && *seen.begin() == 0 &&
         *seen.rbegin() == world - 1;
}

// rank = ((p·dp + d)·cp + c)·tp + t  (shared/DESIGN.md, "The mesh")
TEST(MeshShape, CoordinatesRoundTripAndEachAxisPartitionsTheWorld) {
  const MeshShape shapes[] = {
      {.pp = 1, .dp = 1, .cp = 1, .tp = 1},          {.pp = 1, .dp = 8, .cp = 1, .tp = 1},
      {.pp = 2, .dp = 2, .cp = 1, .tp = 2},          {.pp = 3, .dp = 2, .cp = 2, .tp = 2},
      {.pp = 2, .dp = 4, .cp = 2, .tp = 4, .ep = 2}, {.pp = 4, .dp = 2, .cp = 1, .tp = 8, .ep = 2},
  };
  for (const MeshShape& shape : shapes) {
    SCOPED_TRACE(shape.to_string());
    for (int rank = 0; rank < shape.world_size(); ++rank) {
      EXPECT_EQ(shape.rank_of(shape.coords_of(rank)), rank);
    }
    for (const Axis axis : kAllAxes) {
      const auto groups = shape.groups(axis);
      EXPECT_TRUE(partitions_world(groups, shape.world_size())) << to_string(axis);
      for (const auto& g : groups) EXPECT_EQ(static_cast<int>(g.size()), shape.size(axis));
    }
    // tp is fastest: a tp group is consecutive ranks.
    for (const auto& g : shape.groups(Axis::tp)) EXPECT_EQ(g.back() - g.front(), shape.tp - 1);
  }
}

// The group of `axes` (one axis or an initializer list) that `rank` belongs to, by value.
template <typename Axes>
std::vector<int> group_of(const MeshShape& shape, Axes axes, int rank) {
  return shape.groups(axes)[static_cast<std::size_t>(shape.group_index(axes, rank))];
}
std::vector<int> group_of(const MeshShape& shape, std::initializer_list<Axis> axes, int rank) {
  return shape.groups(axes)[static_cast<std::size_t>(shape.group_index(axes, rank))];
}

// Every mesh of up to 64 ranks from sizes {1, 2, 3, 4, 8}: the groups of two different axes
// through a rank meet in that rank only (the axes are orthogonal), a combined {dp, cp} group
// is exactly the ranks reachable by moving along dp and cp, and ep groups lie inside dp groups.
TEST(MeshShape, AxesAreOrthogonalOverATableOfMeshesUpTo64Ranks) {
  const int sizes[] = {1, 2, 3, 4, 8};
  const Axis axes[] = {Axis::pp, Axis::dp, Axis::cp, Axis::tp};
  int meshes = 0;
  for (int pp : sizes)
    for (int dp : sizes)
      for (int cp : sizes)
        for (int tp : sizes) {
          if (pp * dp * cp * tp > 64) continue;
          const MeshShape shape{.pp = pp, .dp = dp, .cp = cp, .tp = tp, .ep = dp % 2 == 0 ? 2 : 1};
          SCOPED_TRACE(shape.to_string());
          ++meshes;
          for (int rank = 0; rank < shape.world_size(); ++rank) {
            ASSERT_EQ(shape.rank_of(shape.coords_of(rank)), rank);
            for (const Axis a : axes) {
              const std::vector<int> ga = group_of(shape, a, rank);
              ASSERT_NE(std::find(ga.begin(), ga.end(), rank), ga.end());
              for (const Axis b : axes) {
                if (a == b) continue;
                const std::vector<int> gb = group_of(shape, b, rank);
                std::vector<int> common;
                std::set_intersection(ga.begin(), ga.end(), gb.begin(), gb.end(),
                                      std::back_inserter(common));
                ASSERT_EQ(common, std::vector<int>{rank}) << to_string(a) << " × " << to_string(b);
              }
            }
            const std::vector<int> dp_cp = group_of(shape, {Axis::dp, Axis::cp}, rank);
            ASSERT_EQ(static_cast<int>(dp_cp.size()), dp * cp);
            for (int other : dp_cp) {
              const MeshCoords c = shape.coords_of(other), me = shape.coords_of(rank);
              ASSERT_TRUE(c.pp == me.pp && c.tp == me.tp);
            }
            const std::vector<int> ep = group_of(shape, Axis::ep, rank);
            const std::vector<int> dpg = group_of(shape, Axis::dp, rank);
            ASSERT_TRUE(std::includes(dpg.begin(), dpg.end(), ep.begin(), ep.end()));
          }
          EXPECT_TRUE(partitions_world(shape.groups({Axis::dp, Axis::cp}), shape.world_size()));
        }
  EXPECT_GT(meshes, 200);
}

// Expert data parallel: ep × edp is the dp × cp group (each dp × cp rank is in exactly one ep
// group and one edp group, which meet in it), and an edp group holds one ep rank (d mod ep).
TEST(MeshShape, ExpertDataParallelGroupsTileTheDataParallelGroups) {
  for (const MeshShape shape : {MeshShape{.pp = 1, .dp = 4, .cp = 1, .tp = 1, .ep = 2},
                                MeshShape{.pp = 2, .dp = 4, .cp = 2, .tp = 2, .ep = 4},
                                MeshShape{.pp = 1, .dp = 8, .cp = 2, .tp = 1, .ep = 2},
                                MeshShape{.pp = 2, .dp = 2, .cp = 1, .tp = 2, .ep = 1}}) {
    SCOPED_TRACE(shape.to_string());
    const auto edp = shape.expert_dp_groups();
    EXPECT_TRUE(partitions_world(edp, shape.world_size()));
    for (int rank = 0; rank < shape.world_size(); ++rank) {
      const std::vector<int>& mine = edp[static_cast<std::size_t>(shape.expert_dp_group_index(rank))];
      ASSERT_EQ(static_cast<int>(mine.size()), shape.dp * shape.cp / shape.ep);
      ASSERT_TRUE(std::is_sorted(mine.begin(), mine.end()));
      const MeshCoords me = shape.coords_of(rank);
      for (int other : mine) {
        const MeshCoords c = shape.coords_of(other);
        ASSERT_TRUE(c.pp == me.pp && c.tp == me.tp && c.dp % shape.ep == me.dp % shape.ep);
      }
      const std::vector<int> ep = group_of(shape, Axis::ep, rank);
      std::vector<int> common;
      std::set_intersection(mine.begin(), mine.end(), ep.begin(), ep.end(),
                            std::back_inserter(common));
      ASSERT_EQ(common, std::vector<int>{rank});
    }
    if (shape.ep == 1) {
      EXPECT_EQ(edp, shape.groups({Axis::dp, Axis::cp}));
    }
  }
  // dp 4, ep 2: experts of ep rank 0 on dp 0 and 2, of ep rank 1 on dp 1 and 3.
  const MeshShape worked{.pp = 1, .dp = 4, .cp = 1, .tp = 1, .ep = 2};
  EXPECT_EQ(worked.expert_dp_groups(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
}

TEST(MeshShape, DataParallelGroupsOfAWorkedExample) {
  const MeshShape shape{.pp = 2, .dp = 2, .cp = 1, .tp = 2};  // 8 ranks
  const std::vector<std::vector<int>> expected{{0, 2}, {1, 3}, {4, 6}, {5, 7}};
  EXPECT_EQ(shape.groups(Axis::dp), expected);
  EXPECT_EQ(shape.coords_of(6), (MeshCoords{.pp = 1, .dp = 1, .cp = 0, .tp = 0}));
}

TEST(LrSchedule, WarmupThenCosineToMinAsNanoGpt) {
  // warmup 100, decay to step 2000, peak 1e-3, min 1e-4
  EXPECT_DOUBLE_EQ(lr_at(0, 1e-3, 1e-4, 100, 2000), 1e-3 * 1.0 / 101.0);
  EXPECT_DOUBLE_EQ(lr_at(99, 1e-3, 1e-4, 100, 2000), 1e-3 * 100.0 / 101.0);
  EXPECT_DOUBLE_EQ(lr_at(100, 1e-3, 1e-4, 100, 2000), 1e-3);
  EXPECT_NEAR(lr_at(1050, 1e-3, 1e-4, 100, 2000), 1e-4 + 0.5 * 9e-4, 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(2000, 1e-3, 1e-4, 100, 2000), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(5000, 1e-3, 1e-4, 100, 2000), 1e-4);
  const double quarter = 1e-4 + 0.5 * (1.0 + std::cos(std::numbers::pi * 0.25)) * 9e-4;
  EXPECT_NEAR(lr_at(575, 1e-3, 1e-4, 100, 2000), quarter, 1e-15);
}

TEST(GradClipping, ScalesToMaxNormOnlyAboveIt) {
  Parameter p("w", Shape{2, 2}, InitKind::zeros);
  for (int i = 0; i < 4; ++i) p.grad.f32()[i] = 3.0f;  // norm 6
  const auto world = std::vector<Parameter*>{&p};
  clip_grads(world, 6.0, 10.0);
  EXPECT_EQ(p.grad.f32()[0], 3.0f);
  clip_grads(world, 6.0, 1.0);
  EXPECT_NEAR(p.grad.f32()[0], 3.0 / (6.0 + 1e-6), 1e-7);
}

}  // namespace
}  // namespace meshtrain
