// Collectives of the MPI ProcessGroup with rank-valued inputs (Megatron's test pattern): the
// expected result of every operation is computable by hand from the ranks. Also checks the
// byte counters and the groups DeviceMesh builds.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "dist_env.h"
#include "meshtrain/comm/device_mesh.h"

namespace meshtrain {
namespace {

// A group of one rank communicates with nobody: its collectives cost no seconds (every world
// size: a split of the world into single ranks).
TEST(ProcessGroup, AOneRankGroupCountsNoSeconds) {
  const auto world = test::runtime().world_group();
  const auto self = world->split(world->rank(), 0, "self");
  ASSERT_EQ(self->size(), 1);
  std::vector<float> x(1, 1.0f);
  self->all_reduce_sum(x);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(self->counter(CommOp::all_reduce).seconds, 0.0);
}

// The tests below need a peer; they are instantiated only when mpirun started 2 or more ranks.
class ProcessGroupPeers : public ::testing::TestWithParam<int> {};

// The seconds counter includes the wait for a late peer: the last rank arrives 50 ms late, so
// every other rank spends about that long inside the all-reduce (40 ms allows for the ranks
// leaving the barrier at slightly different times).
TEST_P(ProcessGroupPeers, SecondsCounterIncludesTheWaitForALatePeer) {
  const auto world = test::runtime().world_group();
  ASSERT_EQ(world->size(), GetParam());
  world->barrier();
  const bool late = world->rank() == world->size() - 1;
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<float> x(1, 1.0f);
  world->all_reduce_sum(x);
  if (!late) {
    EXPECT_GE(world->counter(CommOp::all_reduce).seconds, 0.040);
  }
}

// Every rank posts its sends to both neighbours before any receive (the pattern that deadlocks
// with blocking sends of large messages), then receives: values and byte counters check out.
// (isend/irecv to oneself are rejected by MT_CHECK, hence the peer.)
TEST_P(ProcessGroupPeers, NonBlockingSendsPostedFirstDoNotDeadlock) {
  const auto world = test::runtime().world_group();
  const int n = world->size(), r = world->rank();
  ASSERT_EQ(n, GetParam());
  constexpr std::size_t kCount = std::size_t{1} << 20;  // 4 MiB: beyond any eager limit
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> to_next(kCount, static_cast<float>(r));
  std::vector<float> to_prev(kCount, 100.0f + static_cast<float>(r));
  std::vector<float> from_prev(kCount, -1.0f), from_next(kCount, -1.0f);
  auto s1 = world->isend(to_next, next, 1);
  auto s2 = world->isend(to_prev, prev, 2);
  auto r1 = world->irecv(from_prev, prev, 1);
  auto r2 = world->irecv(from_next, next, 2);
  r1->wait();
  r2->wait();
  s1->wait();
  s2->wait();
  EXPECT_EQ(from_prev.front(), static_cast<float>(prev));
  EXPECT_EQ(from_prev.back(), static_cast<float>(prev));
  EXPECT_EQ(from_next.back(), 100.0f + static_cast<float>(next));
  EXPECT_EQ(world->counter(CommOp::send).bytes, static_cast<std::int64_t>(2 * kCount * 4));
  EXPECT_EQ(world->counter(CommOp::recv).calls, 2);
}

INSTANTIATE_TEST_SUITE_P(World, ProcessGroupPeers, ::testing::ValuesIn(test::world_of_at_least(2)),
                         test::world_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ProcessGroupPeers);

TEST(ProcessGroup, CollectivesOnRankValuedInputs) {
  const auto world = test::runtime().world_group();
  const int n = world->size();
  const int r = world->rank();
  const float rank_sum = static_cast<float>(n * (n - 1) / 2);

  std::vector<float> x(3, static_cast<float>(r));
  world->all_reduce_sum(x);
  for (float v : x) EXPECT_EQ(v, rank_sum);
  EXPECT_EQ(world->counter(CommOp::all_reduce).bytes, n > 1 ? 12 : 0);

  std::vector<float> m{static_cast<float>(r)};
  world->all_reduce_max(m);
  EXPECT_EQ(m[0], static_cast<float>(n - 1));

  std::vector<float> b{static_cast<float>(r), 7.0f};
  world->broadcast(std::as_writable_bytes(std::span<float>(b)), n - 1);
  EXPECT_EQ(b[0], static_cast<float>(n - 1));

  // reduce-scatter: rank q contributes q + j at position j; rank r receives Σ_q (q + r·2 + i).
  std::vector<float> rs_in(static_cast<std::size_t>(2 * n));
  std::iota(rs_in.begin(), rs_in.end(), static_cast<float>(r));
  std::vector<float> rs_out(2);
  world->reduce_scatter_sum(rs_in, rs_out);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(rs_out[static_cast<std::size_t>(i)], rank_sum + static_cast<float>(n * (2 * r + i)));
  }

  std::vector<float> ag_in{static_cast<float>(10 * r), static_cast<float>(10 * r + 1)};
  std::vector<float> ag_out(static_cast<std::size_t>(2 * n));
  world->all_gather(ag_in, ag_out);
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(ag_out[static_cast<std::size_t>(2 * q + 1)], static_cast<float>(10 * q + 1));

  // all-to-all: rank r sends 100·r + q to rank q, so it receives 100·q + r from rank q.
  std::vector<float> a2a_in(static_cast<std::size_t>(n)), a2a_out(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) a2a_in[static_cast<std::size_t>(q)] = static_cast<float>(100 * r + q);
  world->all_to_all(a2a_in, a2a_out);
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(a2a_out[static_cast<std::size_t>(q)], static_cast<float>(100 * q + r));

  // all_to_allv: rank r sends q + r + 1 elements to rank q, valued 1000·r + 100·q + i, so
  // from rank q it receives r + q + 1 elements 1000·q + 100·r + i.
  std::vector<std::int64_t> send_counts, recv_counts;
  std::vector<float> v_in;
  for (int q = 0; q < n; ++q) {
    send_counts.push_back(q + r + 1);
    recv_counts.push_back(r + q + 1);
    for (int i = 0; i < q + r + 1; ++i) v_in.push_back(static_cast<float>(1000 * r + 100 * q + i));
  }
  std::vector<float> v_out(static_cast<std::size_t>(n * r + n * (n + 1) / 2));
  const std::int64_t a2a_bytes_before = world->counter(CommOp::all_to_all).bytes;
  world->all_to_allv(v_in, send_counts, v_out, recv_counts);
  std::size_t at = 0;
  for (int q = 0; q < n; ++q) {
    for (int i = 0; i < r + q + 1; ++i, ++at) {
      EXPECT_EQ(v_out[at], static_cast<float>(1000 * q + 100 * r + i)) << "from " << q << " #" << i;
    }
  }
  EXPECT_EQ(at, v_out.size());
  EXPECT_EQ(world->counter(CommOp::all_to_all).bytes - a2a_bytes_before,
            n > 1 ? static_cast<std::int64_t>(v_in.size() * sizeof(float)) : 0);

  if (n > 1) {  // a ring of send/recv: even ranks send first, odd ranks receive first
    std::vector<float> out{static_cast<float>(r)}, in{-1.0f};
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      world->send(out, next, 5);
      world->recv(in, prev, 5);
    } else {
      world->recv(in, prev, 5);
      world->send(out, next, 5);
    }
    EXPECT_EQ(in[0], static_cast<float>(prev));
    EXPECT_EQ(world->counter(CommOp::send).bytes, 4);
  }
}

// Integers travel as integers: values above 2^24 (where f32 stops being exact: 2^24 + 1 rounds
// to 2^24) and sums above 2^53 (f64's limit) come back exact, with 4 and 8 bytes per element
// counted as for f32 and f64.
TEST(ProcessGroup, IntegerCollectivesAreExactBeyondFloatPrecision) {
  const auto world = test::runtime().world_group();
  const int n = world->size();
  const int r = world->rank();
  constexpr std::int32_t kBig = (1 << 24) + 1;
  ASSERT_NE(static_cast<std::int32_t>(static_cast<float>(kBig)), kBig) << "f32 would round it";

  const std::int64_t bytes_before = world->counter(CommOp::all_reduce).bytes;
  std::vector<std::int32_t> x{kBig + r, 3};
  world->all_reduce_sum(std::span<std::int32_t>(x));
  EXPECT_EQ(x[0], n * kBig + n * (n - 1) / 2);
  EXPECT_EQ(x[1], 3 * n);
  EXPECT_EQ(world->counter(CommOp::all_reduce).bytes - bytes_before, n > 1 ? 8 : 0);

  constexpr std::int64_t kHuge = (std::int64_t{1} << 53) + 1;
  std::vector<std::int64_t> y{kHuge + r};
  world->all_reduce_sum(std::span<std::int64_t>(y));
  EXPECT_EQ(y[0], n * kHuge + n * (n - 1) / 2);

  std::vector<std::int32_t> m{kBig + 2 * r};
  world->all_reduce_max(std::span<std::int32_t>(m));
  EXPECT_EQ(m[0], kBig + 2 * (n - 1));

  const std::int32_t mine = kBig + r;
  std::vector<std::int32_t> all(static_cast<std::size_t>(n));
  world->all_gather(std::span<const std::int32_t>(&mine, 1), std::span<std::int32_t>(all));
  for (int q = 0; q < n; ++q) EXPECT_EQ(all[static_cast<std::size_t>(q)], kBig + q);

  // all-to-all: rank r sends kBig + 100·r + q to rank q, so it receives kBig + 100·q + r.
  std::vector<std::int32_t> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) in[static_cast<std::size_t>(q)] = kBig + 100 * r + q;
  const std::int64_t a2a_before = world->counter(CommOp::all_to_all).bytes;
  world->all_to_all(std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
  for (int q = 0; q < n; ++q) EXPECT_EQ(out[static_cast<std::size_t>(q)], kBig + 100 * q + r);
  EXPECT_EQ(world->counter(CommOp::all_to_all).bytes - a2a_before, n > 1 ? 4 * n : 0);
}

TEST(DeviceMesh, DataParallelGroupOfTheWorldMatchesMeshShape) {
  const auto world = test::runtime().world_group();
  const MeshShape shape{.dp = world->size()};
  const DeviceMesh mesh(shape, *world);
  EXPECT_EQ(mesh.group(Axis::dp).size(), world->size());
  EXPECT_EQ(mesh.group(Axis::dp).rank(), world->rank());
  EXPECT_EQ(mesh.group(Axis::tp).size(), 1);
  EXPECT_EQ(mesh.group(Axis::dp).world_ranks(), shape.groups(Axis::dp)[0]);
  std::vector<float> one{1.0f};
  mesh.group(Axis::dp).all_reduce_sum(one);
  EXPECT_EQ(one[0], static_cast<float>(world->size()));
}

}  // namespace
}  // namespace meshtrain
