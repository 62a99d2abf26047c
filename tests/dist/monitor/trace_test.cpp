// The trace recorder's comm hooks (core/trace.h, monitor/trace_observer.h, docs/tracing.md):
// every operation of a group the TraceObserver watches, run while recording, leaves one event
// with the group, op, peer and exactly the bytes its counter counted; non-blocking ones their
// posting and their wait; nothing when recording is off, on another thread, or beyond the buffer's
// capacity (counted as dropped).
#include "meshtrain/core/trace.h"

#include <gtest/gtest.h>

#include <array>
#include <thread>
#include <vector>

#include "dist_env.h"
#include "meshtrain/monitor/trace_observer.h"

namespace meshtrain {
namespace {

using Counters = std::array<CommCounter, kNumCommOps>;

Counters counters_of(const ProcessGroup& g) {
  Counters c;
  for (std::size_t op = 0; op < kNumCommOps; ++op) c[op] = g.counter(static_cast<CommOp>(op));
  return c;
}

// One blocking and one non-blocking send/recv pair around the ring of `g` (size ≥ 2).
void run_point_to_point(ProcessGroup& g) {
  const int next = (g.rank() + 1) % g.size(), prev = (g.rank() + g.size() - 1) % g.size();
  std::vector<float> sent(7, 2.0f), got(7);
  if (g.rank() % 2 == 0) {
    g.send(sent, next, 1);
    g.recv(got, prev, 1);
  } else {
    g.recv(got, prev, 1);
    g.send(sent, next, 1);
  }
  auto r = g.irecv(got, prev, 2);
  auto s = g.isend(sent, next, 2);
  s->wait();
  r->wait();
}

// One call of every operation (blocking and non-blocking) on `g`. A group of one has no peer
// for p2p; its collectives still run, and the tests assert that they record nothing.
void run_every_operation(ProcessGroup& g) {
  const auto n = static_cast<std::size_t>(g.size());
  std::vector<float> x(3 * n, 1.0f), out(3 * n), part(3);
  std::vector<double> d(5, 1.0);
  g.all_reduce_sum(std::span<float>(x));
  g.all_reduce_sum(std::span<double>(d));
  g.all_reduce_max(std::span<float>(x));
  g.broadcast(std::as_writable_bytes(std::span<double>(d)), 0);
  g.barrier();
  g.reduce_scatter_sum(x, part);
  g.all_gather(part, out);
  g.all_to_all(x, out);
  const std::vector<std::int64_t> counts(n, 3);
  g.all_to_allv(x, counts, out, counts);
  g.iall_gather(part, out)->wait();
  g.iall_reduce_sum(std::span<float>(x))->wait();
  if (g.size() > 1) run_point_to_point(g);
}

TEST(Trace, EveryOperationIsRecordedWithTheBytesItsCounterCounted) {
  TraceObserver comm;  // declared first: it outlives the group it watches
  const auto world = test::runtime().world_group();
  world->add_observer(comm);
  trace::reset();
  const Counters before = counters_of(*world);
  trace::start(1000);
  run_every_operation(*world);
  trace::stop();
  const Counters after = counters_of(*world);
  std::array<std::int64_t, kNumCommOps> calls{}, bytes{};
  std::int64_t waits = 0;
  for (const trace::Event& e : trace::events()) {
    ASSERT_TRUE(e.kind == trace::Kind::comm || e.kind == trace::Kind::comm_wait);
    EXPECT_EQ(comm.group_names().at(static_cast<std::size_t>(e.group)), world->name());
    EXPECT_LE(e.start_ns, e.end_ns);
    const auto op = static_cast<CommOp>(e.op);
    if (op == CommOp::send || op == CommOp::recv) {
      const int peer =
          (world->rank() + (op == CommOp::send ? 1 : world->size() - 1)) % world->size();
      EXPECT_EQ(e.peer, world->world_ranks()[static_cast<std::size_t>(peer)]);
    } else {
      EXPECT_EQ(e.peer, -1);
    }
    if (e.kind == trace::Kind::comm_wait) {
      ++waits;
      EXPECT_EQ(e.bytes, 0);
      EXPECT_EQ(e.wait_ns, e.end_ns - e.start_ns);
      continue;
    }
    calls[e.op] += 1;
    bytes[e.op] += e.bytes;
    // A blocking operation waits its whole duration; a posting's wait is its wait() (≥ 0).
    if (!e.nonblocking) {
      EXPECT_EQ(e.wait_ns, e.end_ns - e.start_ns);
    }
    EXPECT_GE(e.wait_ns, 0);
  }
  for (std::size_t op = 0; op < kNumCommOps; ++op) {
    SCOPED_TRACE(std::string(to_string(static_cast<CommOp>(op))));
    EXPECT_EQ(calls[op], after[op].calls - before[op].calls);
    EXPECT_EQ(bytes[op], after[op].bytes - before[op].bytes);
  }
  if (world->size() == 1) {  // a group of one runs and counts nothing
    EXPECT_TRUE(trace::events().empty());
  } else {
    // 11 blocking calls (3 all-reduces, broadcast, barrier, reduce-scatter, all-gather,
    // all-to-all, all-to-allv, send, recv), 4 postings (iall_gather, iall_reduce_sum, isend,
    // irecv) and their 4 waits.
    EXPECT_EQ(trace::events().size(), 19u);
    EXPECT_EQ(waits, 4);
    EXPECT_EQ(bytes[static_cast<std::size_t>(CommOp::send)], 2 * 7 * 4);
    EXPECT_EQ(bytes[static_cast<std::size_t>(CommOp::all_reduce)],
              3 * static_cast<std::int64_t>(3 * world->size() * 4) + 5 * 8);
  }
  trace::reset();
}

TEST(Trace, NothingIsRecordedWhenOffOrOnAnotherThreadAndAFullBufferCountsDrops) {
  TraceObserver comm;
  const auto world = test::runtime().world_group();
  world->add_observer(comm);
  trace::reset();
  run_every_operation(*world);  // not started
  EXPECT_TRUE(trace::events().empty());
  trace::start(3);
  std::thread([] { const trace::Scope other(trace::Kind::data); }).join();
  EXPECT_TRUE(trace::events().empty()) << "another thread's event was recorded";
  for (int i = 0; i < 5; ++i) const trace::Scope phase(trace::Kind::forward, i, 0);
  ASSERT_EQ(trace::events().size(), 3u);
  EXPECT_EQ(trace::dropped(), 2);
  EXPECT_EQ(trace::events()[2].microbatch, 2);
  trace::reset();
  EXPECT_TRUE(trace::events().empty());
  EXPECT_EQ(trace::dropped(), 0);
}

}  // namespace
}  // namespace meshtrain
