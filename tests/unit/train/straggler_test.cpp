// find_stragglers (train/straggler.h): the rule on hand-made phase times — a slow phase is
// named with its rank, a wait is never blamed, small wobbles and tiny phases are not reported.
#include "meshtrain/train/straggler.h"

#include <gtest/gtest.h>

#include <vector>

namespace meshtrain {
namespace {

// Per step: data 1 ms, forward 10 ms, backward 20 ms, optimizer 3 ms, waiting 2 ms.
PhaseSeconds typical(double steps) {
  PhaseSeconds p;
  p[Phase::data] = 0.001 * steps;
  p[Phase::forward] = 0.010 * steps;
  p[Phase::backward] = 0.020 * steps;
  p[Phase::optimizer] = 0.003 * steps;
  p[Phase::comm_wait] = 0.002 * steps;
  return p;
}

TEST(Stragglers, NamesTheRankAndItsSlowPhase) {
  std::vector<PhaseSeconds> ranks(4, typical(10));
  ranks[2][Phase::backward] += 10 * 0.015;   // 15 ms per step more: > 0.2 × 36 ms
  ranks[0][Phase::comm_wait] += 10 * 0.015;  // waiting for rank 2 is not a fault of rank 0
  const auto found = find_stragglers(ranks, 10, 0.2);
  ASSERT_EQ(found.size(), 1U);
  EXPECT_EQ(found[0].rank, 2);
  EXPECT_EQ(found[0].phase, Phase::backward);
  EXPECT_NEAR(found[0].seconds, 0.035, 1e-12);
  EXPECT_NEAR(found[0].median, 0.020, 1e-12);
}

TEST(Stragglers, SmallExcessesAndTinyPhasesAreNotReported) {
  std::vector<PhaseSeconds> ranks(3, typical(5));
  ranks[1][Phase::forward] += 5 * 0.005;  // +5 ms per step < 0.2 × 36 ms
  ranks[2][Phase::data] += 5 * 0.003;     // data 4× the median, yet 3 ms < 7.2 ms
  EXPECT_TRUE(find_stragglers(ranks, 5, 0.2).empty());
  EXPECT_TRUE(find_stragglers({typical(5)}, 5, 0.2).empty()) << "one rank has no peers";
}

TEST(Stragglers, EachRankOnceWithItsWorstPhase) {
  std::vector<PhaseSeconds> ranks(5, typical(1));
  ranks[4][Phase::forward] += 0.010;
  ranks[4][Phase::optimizer] += 0.030;
  ranks[1][Phase::data] += 0.020;
  const auto found = find_stragglers(ranks, 1, 0.2);
  ASSERT_EQ(found.size(), 2U);
  EXPECT_EQ(found[0].rank, 1);
  EXPECT_EQ(found[0].phase, Phase::data);
  EXPECT_EQ(found[1].rank, 4);
  EXPECT_EQ(found[1].phase, Phase::optimizer);
}

}  // namespace
}  // namespace meshtrain
