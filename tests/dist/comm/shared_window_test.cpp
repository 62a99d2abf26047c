// The shared-memory all-reduce (ProcessGroup::allocate_shared, comm/shared_window.h): with
// every rank of mpirun on this one node, a group's allocate_shared gives every rank a window,
// and iall_reduce_sum over it leaves on every rank, bitwise, the sum of all ranks' inputs taken
// in rank order ((x0 + x1) + x2) + …, times the scale asked for, computed here by each rank
// from the inputs' formula.
// The inputs mix magnitudes (2^-10 … 2^23) so that another order of the additions (at 4 and 8
// ranks) would change the last bits. Also: several posts in a row, ranks posting seconds
// apart (the early one tests, then waits; the work still completes), the last rank to post
// pauses one test() for those that waited, a post before the previous one completed is refused,
// each rank learns its own first non-finite input, the counters count one all_reduce of the
// tensor's bytes, the window's bytes are counted under the category asked for while the tensor
// lives, a dp subgroup gets windows of its own, and MESHTRAIN_SHM_ALL_REDUCE=0 turns it off.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist_env.h"
#include "meshtrain/core/error.h"
#include "meshtrain/train/collective_verdict.h"

namespace meshtrain {
namespace {

class SharedWindowPeers : public ::testing::TestWithParam<int> {};

// Rank r's input element i, for `post` = 0, 1, …: magnitudes from 1e-3 to 1e4, so the sum's
// rounding depends on the order of the additions. Exact in every step (a small integer times a
// power of two), so no contraction into an FMA can make two calls differ.
float input(int r, std::int64_t i, int post) {
  const int exponent = static_cast<int>((r * 3 + i + post) % 24) - 10;
  return std::ldexp(static_cast<float>(1 + (i * 7 + r * 13 + post) % 1001), exponent);
}

void fill(Tensor& t, int r, int post) {
  float* x = t.f32();
  for (std::int64_t i = 0; i < t.numel(); ++i) x[i] = input(r, i, post);
}

// Every element bitwise scale × (the rank-order sum); returns the number that differ.
std::int64_t mismatches(const Tensor& t, int n, int post, float scale = 1.0f) {
  const float* x = t.f32();
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    float want = input(0, i, post);
    for (int r = 1; r < n; ++r) want += input(r, i, post);
    want *= scale;
    if (x[i] != want) ++bad;
  }
  return bad;
}

// 300,001 elements: 5 claimable chunks, the last one partial.
constexpr std::int64_t kCount = 300001;

TEST_P(SharedWindowPeers, SumsInRankOrderBitwiseOnEveryRankPostAfterPost) {
  const auto world = test::runtime().world_group();
  ASSERT_EQ(world->size(), GetParam());
  const auto before = TrackedAllocator::instance().stats(MemCategory::grads).current_bytes;
  {
    Tensor t = world->allocate_shared(kCount, MemCategory::grads);
    ASSERT_TRUE(t.defined()) << "mpirun's ranks share this node: a window was expected";
    EXPECT_EQ(TrackedAllocator::instance().stats(MemCategory::grads).current_bytes - before,
              kCount * 4);
    for (float v : t.span_f32()) ASSERT_EQ(v, 0.0f);
    world->reset_counters();
    // The sum alone, the mean (1/n), and a scale whose products round (0.3).
    const float scales[] = {1.0f, 1.0f / static_cast<float>(world->size()), 0.3f};
    for (int post = 0; post < 3; ++post) {
      fill(t, world->rank(), post);
      auto request = world->iall_reduce_sum(t.span_f32(), scales[post]);
      request->wait();
      EXPECT_EQ(mismatches(t, world->size(), post, scales[post]), 0) << "post " << post;
    }
    EXPECT_EQ(world->counter(CommOp::all_reduce).calls, 3);
    EXPECT_EQ(world->counter(CommOp::all_reduce).bytes, 3 * kCount * 4);
    world->barrier();  // nobody frees its window while a peer still reads it
  }
  EXPECT_EQ(TrackedAllocator::instance().stats(MemCategory::grads).current_bytes, before);
}

// Rank 0 posts at once and tests while the others are still 0.3 s away: test() cannot finish
// (a peer has not posted), then wait() completes once they post; every rank gets the sum.
TEST_P(SharedWindowPeers, AnEarlyRankTestsThenWaitsForLatePosts) {
  const auto world = test::runtime().world_group();
  Tensor t = world->allocate_shared(kCount, MemCategory::comm);
  ASSERT_TRUE(t.defined());
  fill(t, world->rank(), 7);
  world->barrier();
  if (world->rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto request = world->iall_reduce_sum(t.span_f32());
  if (world->rank() == 0) {
    EXPECT_FALSE(request->test()) << "finished before the peers posted";
  }
  request->wait();
  EXPECT_TRUE(request->test());
  EXPECT_EQ(mismatches(t, world->size(), 7), 0);
  world->barrier();
}

// The member whose post completes the set (the last to post) claims nothing in its first test()
// after the post, so the members that were waiting sum the bucket; its next test() claims
// again (a loop of test() calls alone completes). Why: overlap_grad_reduce tests each bucket
// right after posting it, so the member that was behind in backward summed every bucket there
// and fell further behind. Ranks post in turn (rank n − 1 last); an earlier poster's test(),
// rank 0's at np 2 and a middle rank's at np 4 (not only the first poster claims), completes
// the first post; in the second the last rank's two test() calls in a row complete it.
TEST_P(SharedWindowPeers, TheLastToPostPausesOneTestForTheMembersThatWaited) {
  const auto world = test::runtime().world_group();
  const int n = world->size();
  const int last = n - 1;
  const int helper = n > 2 ? 1 : 0;
  Tensor t = world->allocate_shared(kCount, MemCategory::comm);
  ASSERT_TRUE(t.defined());
  for (int post = 4; post <= 5; ++post) {
    fill(t, world->rank(), post);
    std::unique_ptr<CommRequest> request;
    for (int turn = 0; turn < n; ++turn) {
      if (world->rank() == turn) request = world->iall_reduce_sum(t.span_f32());
      world->barrier();
    }
    if (world->rank() == last) {
      EXPECT_FALSE(request->test()) << "post " << post << ": the last poster's first test summed";
      if (post == 5) {
        EXPECT_TRUE(request->test()) << "its second test() did not complete the sum";
      }
    }
    world->barrier();
    if (post == 4 && world->rank() == helper) {
      EXPECT_TRUE(request->test()) << "rank " << helper << " posted earlier and tested";
    }
    world->barrier();
    EXPECT_TRUE(request->test()) << "post " << post;
    EXPECT_EQ(mismatches(t, n, post), 0) << "post " << post;
    world->barrier();
  }
}

// Posting again before the previous request completed would race with the peers' reads.
TEST_P(SharedWindowPeers, APostBeforeThePreviousCompletedIsRefused) {
  const auto world = test::runtime().world_group();
  Tensor t = world->allocate_shared(1000, MemCategory::comm);
  ASSERT_TRUE(t.defined());
  world->barrier();
  if (world->rank() == 0) {
    auto first = world->iall_reduce_sum(t.span_f32());
    EXPECT_THROW(world->iall_reduce_sum(t.span_f32()), Error);
    world->barrier();  // the peers post only now: `first` can complete
    first->wait();
  } else {
    world->barrier();
    world->iall_reduce_sum(t.span_f32())->wait();
  }
  world->barrier();
}

// The request names this member's own lowest-index NaN or ±inf of the post (the sum spreads it
// to every member, so only the inputs tell whose it was): nothing when all were finite — also
// on rank 0, whose inputs stay finite while its sum does not —, the lowest index when a block
// holds several and a later chunk holds another, and a post's report does not carry into the
// next (the line is reset as the member posts).
TEST_P(SharedWindowPeers, EachMemberLearnsItsOwnFirstNonFiniteInput) {
  const auto world = test::runtime().world_group();
  Tensor t = world->allocate_shared(kCount, MemCategory::comm);
  ASSERT_TRUE(t.defined());
  const int r = world->rank();
  const float inf = std::numeric_limits<float>::infinity();
  fill(t, r, 0);
  auto request = world->iall_reduce_sum(t.span_f32());
  request->wait();
  EXPECT_FALSE(request->first_non_finite_input().has_value()) << "all inputs were finite";

  fill(t, r, 1);
  const std::int64_t nan_at = 70000 + 17 * r;
  if (r != 0) {
    t.f32()[250000 + r] = -inf;
    t.f32()[nan_at + 5] = inf;
    t.f32()[nan_at] = std::numeric_limits<float>::quiet_NaN();
  }
  request = world->iall_reduce_sum(t.span_f32());
  request->wait();
  const auto first = request->first_non_finite_input();
  if (r == 0) {
    EXPECT_FALSE(first.has_value())
        << "rank 0's inputs were finite; got element " << first->element;
  } else {
    // EXPECT, not ASSERT: every rank must reach the barrier below.
    EXPECT_TRUE(first.has_value()) << "post 1's NaN went unreported";
    if (first) {
      EXPECT_EQ(first->element, nan_at);
      EXPECT_TRUE(std::isnan(first->value)) << first->value;
    }
  }

  fill(t, r, 2);
  if (r != 0) t.f32()[kCount - 1] = inf;
  request = world->iall_reduce_sum(t.span_f32());
  request->wait();
  const auto last = request->first_non_finite_input();
  if (r == 0) {
    EXPECT_FALSE(last.has_value());
  } else {
    EXPECT_TRUE(last.has_value()) << "post 2's +inf went unreported";
    if (last) {
      EXPECT_EQ(last->element, kCount - 1) << "post 1's note carried over";
      EXPECT_EQ(last->value, inf);
    }
  }
  world->barrier();
}

// A subgroup (the even and the odd world ranks, as dp groups under tp 2) gets a window of its
// own: its sum is over its own members only.
class SharedWindowSubgroups : public ::testing::TestWithParam<int> {};

TEST_P(SharedWindowSubgroups, ASubgroupSumsOverItsOwnMembers) {
  const auto world = test::runtime().world_group();
  ASSERT_EQ(world->size(), GetParam());
  const auto half = world->split(world->rank() % 2, world->rank(), "dp");
  Tensor t = half->allocate_shared(kCount, MemCategory::comm);
  ASSERT_TRUE(t.defined());
  fill(t, half->rank(), 3);
  half->iall_reduce_sum(t.span_f32())->wait();
  EXPECT_EQ(mismatches(t, half->size(), 3), 0);
  world->barrier();
}

// MESHTRAIN_SHM_ALL_REDUCE=0: no window; the all-reduce goes by messages.
TEST_P(SharedWindowPeers, TheEnvironmentCanTurnItOff) {
  const auto world = test::runtime().world_group();
  ::setenv("MESHTRAIN_SHM_ALL_REDUCE", "0", 1);
  const Tensor t = world->allocate_shared(16, MemCategory::comm);
  ::unsetenv("MESHTRAIN_SHM_ALL_REDUCE");
  EXPECT_FALSE(t.defined());
}

// Ranks whose environments disagree (rank 0 has MESHTRAIN_SHM_ALL_REDUCE=0, the others not)
// all go by messages, none waits for the others in a window: the switch joins the MIN.
TEST_P(SharedWindowPeers, RanksThatDisagreeAllGoByMessages) {
  const auto world = test::runtime().world_group();
  if (world->rank() == 0) ::setenv("MESHTRAIN_SHM_ALL_REDUCE", "0", 1);
  const Tensor t = world->allocate_shared(16, MemCategory::comm);
  ::unsetenv("MESHTRAIN_SHM_ALL_REDUCE");
  EXPECT_FALSE(t.defined());
}

// A value other than 0 or 1 throws on every rank before any collective, naming the switch.
TEST_P(SharedWindowPeers, AValueOtherThanZeroOrOneIsAnError) {
  const auto world = test::runtime().world_group();
  ::setenv("MESHTRAIN_SHM_ALL_REDUCE", "off", 1);
  try {
    world->allocate_shared(16, MemCategory::comm);
    ADD_FAILURE() << "no error for MESHTRAIN_SHM_ALL_REDUCE=off";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MESHTRAIN_SHM_ALL_REDUCE"), std::string::npos)
        << e.what();
  }
  ::unsetenv("MESHTRAIN_SHM_ALL_REDUCE");
  world->barrier();
}

// A bad value on one rank only (the last) stops every rank with the same ConfigError, naming
// that rank and its value, instead of leaving the others in their next collective (the
// trainer's check, train/collective_verdict.h).
TEST_P(SharedWindowPeers, ABadValueOnOneRankStopsEveryRank) {
  const auto world = test::runtime().world_group();
  if (world->rank() == world->size() - 1) ::setenv("MESHTRAIN_SHM_ALL_REDUCE", "off", 1);
  try {
    check_environment_for_all(*world);
    ADD_FAILURE() << "no error on rank " << world->rank();
  } catch (const ConfigError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find(fmt::format("MESHTRAIN_SHM_ALL_REDUCE = rank {}: 'off'", world->size() - 1)),
              std::string::npos)
        << text;
  }
  ::unsetenv("MESHTRAIN_SHM_ALL_REDUCE");
  EXPECT_NO_THROW(check_environment_for_all(*world));
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SharedWindowPeers);
INSTANTIATE_TEST_SUITE_P(World, SharedWindowPeers, ::testing::ValuesIn(test::world_of_at_least(2)),
                         test::world_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SharedWindowSubgroups);
INSTANTIATE_TEST_SUITE_P(World, SharedWindowSubgroups,
                         ::testing::ValuesIn(test::world_of_at_least(4)), test::world_name);

// A group of one rank has nobody to share with.
TEST(SharedWindow, AOneRankGroupGetsNoWindow) {
  const auto world = test::runtime().world_group();
  const auto self = world->split(world->rank(), 0, "self");
  EXPECT_FALSE(self->allocate_shared(16, MemCategory::comm).defined());
}

}  // namespace
}  // namespace meshtrain
