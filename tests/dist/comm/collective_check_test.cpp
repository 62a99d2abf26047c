// parallel.debug_collectives (comm/process_group.h, set_debug_checks): ranks that call
// different collectives — another size, another operation, another root — all stop with an
// Error listing every rank's call, instead of hanging or reducing mismatched buffers; matching
// calls run as before and are numbered. The mismatches need peers: that suite is instantiated
// only at np ≥ 2.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist_env.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// Runs `call` with the checks of `group` on and returns the Error message ("" when none was
// thrown).
template <typename Call>
std::string error_of(ProcessGroup& group, Call&& call) {
  group.set_debug_checks(true);
  std::string message;
  try {
    call();
  } catch (const Error& e) {
    message = e.what();
  }
  group.set_debug_checks(false);
  return message;
}

// Matching calls pass, with their numbers (a one-rank world calls no collective).
TEST(CollectiveCheck, MatchingCallsPassAndAreNumbered) {
  const auto world = test::runtime().world_group();
  const int n = world->size();
  const std::uint64_t before = world->collectives_called();
  std::vector<float> x(8, 1.0f);
  EXPECT_EQ(error_of(*world, [&] { world->all_reduce_sum(x); }), "");
  EXPECT_EQ(x[0], static_cast<float>(n));
  EXPECT_EQ(world->collectives_called(), before + (n > 1 ? 1 : 0));
}

class CollectiveCheckPeers : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveCheckPeers, MismatchedSizeOperationOrRootStopsEveryRank) {
  const auto world = test::runtime().world_group();
  const int n = world->size();
  const int me = world->rank();
  ASSERT_EQ(n, GetParam());
  // Another size on the last rank.
  std::vector<float> y(me == n - 1 ? 5 : 4, 1.0f);
  std::string text = error_of(*world, [&] { world->all_reduce_sum(y); });
  EXPECT_NE(text.find("mismatched collective on world"), std::string::npos) << text;
  EXPECT_NE(text.find("all_reduce_sum(f32) of 4 elements"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("group rank {} (world rank {})", n - 1, n - 1) +
                      std::string(": collective #")),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("all_reduce_sum(f32) of 5 elements"), std::string::npos) << text;
  // Another operation of the same size.
  std::vector<float> z(4, 1.0f);
  text = error_of(*world, [&] {
    if (me == 0) {
      world->all_reduce_max(z);
    } else {
      world->all_reduce_sum(z);
    }
  });
  EXPECT_NE(text.find("all_reduce_max(f32) of 4 elements"), std::string::npos) << text;
  EXPECT_NE(text.find("all_reduce_sum(f32) of 4 elements"), std::string::npos) << text;
  // Another root.
  std::vector<std::byte> b(16);
  text = error_of(*world, [&] { world->broadcast(b, me == 0 ? 0 : 1); });
  EXPECT_NE(text.find("broadcast(bytes) of 16 elements, root 0"), std::string::npos) << text;
  EXPECT_NE(text.find("broadcast(bytes) of 16 elements, root 1"), std::string::npos) << text;
  // all_to_allv whose last rank expects one element more from rank 0 than rank 0 sends: named,
  // on every rank, before any data moves.
  std::vector<std::int64_t> send(static_cast<std::size_t>(n), 2), recv(send);
  if (me == n - 1) recv[0] = 3;
  std::vector<float> in(static_cast<std::size_t>(2 * n), 1.0f);
  std::vector<float> out(me == n - 1 ? static_cast<std::size_t>(2 * n + 1) : in.size());
  text = error_of(*world, [&] { world->all_to_allv(in, send, out, recv); });
  EXPECT_NE(text.find("mismatched all_to_allv counts on world"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("group rank 0 sends 2 elements to group rank {}, which expects 3",
                                  n - 1)),
            std::string::npos)
      << text;
  // The group still works after the rejected calls (none of them ran).
  std::vector<float> w(3, 2.0f);
  EXPECT_EQ(error_of(*world, [&] { world->all_reduce_sum(w); }), "");
  EXPECT_EQ(w[2], 2.0f * static_cast<float>(n));
}

INSTANTIATE_TEST_SUITE_P(World, CollectiveCheckPeers,
                         ::testing::ValuesIn(test::world_of_at_least(2)), test::world_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CollectiveCheckPeers);

}  // namespace
}  // namespace meshtrain
