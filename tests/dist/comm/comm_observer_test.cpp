// A ProcessGroup's observers (comm/comm_observer.h): an observer attached to a group is told
// of each of its operations, in order — started, blocking, finished for a blocking one;
// started, (blocking, not_blocking for a collective,) posted, then blocking and finished when
// waited for — with the operation's kind, bytes, sequence number and peer, the observer's own
// id of the group and its own token of the operation. split() hands the observers on; a
// removed observer is told nothing more; a group of one rank reports nothing.
#include "meshtrain/comm/comm_observer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dist_env.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

std::string_view end_name(CommEnd how) {
  switch (how) {
    case CommEnd::completed:
      return "completed";
    case CommEnd::waited:
      return "waited";
    case CommEnd::tested:
      return "tested";
    case CommEnd::failed:
      return "failed";
  }
  return "?";
}

// Writes every call as one line; ids 101, 102, ... for the groups, tokens 1, 2, ... for the
// operations (posted adds 1000).
class Recorder final : public CommObserver {
 public:
  Recorder() { calls.reserve(1000); }
  std::uint64_t group_added(const ProcessGroup& group) override {
    groups.push_back(group.name());
    return 100 + groups.size();
  }
  void group_removed(const ProcessGroup& /*group*/, std::uint64_t id) noexcept override {
    removed.push_back(id);
  }
  std::uint64_t started(const CommEvent& op, std::int64_t /*at_ns*/) noexcept override {
    log("started", op);
    return ++tokens;
  }
  void blocking(const CommEvent& op, std::int64_t /*at_ns*/) noexcept override {
    log("blocking", op);
  }
  void not_blocking() noexcept override { calls.emplace_back("not_blocking"); }
  std::uint64_t posted(const CommEvent& op, std::int64_t start_ns,
                       std::int64_t end_ns) noexcept override {
    log("posted", op);
    if (start_ns > end_ns) calls.emplace_back("posted: start after end");
    return op.token + 1000;
  }
  void finished(const CommEvent& op, CommEnd how, std::int64_t start_ns,
                std::int64_t end_ns) noexcept override {
    log(fmt::format("finished {}", end_name(how)), op);
    if (start_ns > end_ns) calls.emplace_back("finished: start after end");
  }

  std::vector<std::string> calls, groups;
  std::vector<std::uint64_t> removed;

 private:
  void log(std::string_view what, const CommEvent& op) {
    calls.push_back(fmt::format("{} {} seq {} bytes {} peer {} group {} token {}", what,
                                to_string(op.op), op.seq, op.bytes, op.peer, op.group, op.token));
  }
  std::uint64_t tokens = 0;
};

TEST(CommObserver, SeesEveryOperationWithItsKindBytesAndSequenceNumber) {
  Recorder rec;  // declared first: it outlives the groups it watches
  const auto world = test::runtime().world_group();
  world->add_observer(rec);
  ASSERT_EQ(rec.groups, std::vector<std::string>{world->name()});
  const int n = world->size(), me = world->rank();
  const std::uint64_t seq = world->collectives_called();
  std::vector<float> x(6, 1.0f);
  world->all_reduce_sum(x);
  world->iall_reduce_sum(x)->wait();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  if (n > 1) {
    std::vector<float> got(6);
    auto r = world->irecv(got, prev, 3);
    world->send(std::span<const float>(x).first(2), next, 3);
    r->wait();
  }
  if (n == 1) {  // a group of one runs nothing and reports nothing
    EXPECT_TRUE(rec.calls.empty());
    return;
  }
  const auto wr = [&](int r) { return world->world_ranks()[static_cast<std::size_t>(r)]; };
  const std::string ar = fmt::format("all_reduce seq {} bytes 24 peer -1 group 101", seq + 1);
  const std::string iar = fmt::format("all_reduce seq {} bytes 24 peer -1 group 101", seq + 2);
  const std::string recv = fmt::format("recv seq 1 bytes 24 peer {} group 101", wr(prev));
  const std::string send = fmt::format("send seq 1 bytes 8 peer {} group 101", wr(next));
  const std::vector<std::string> expected = {
      "started " + ar + " token 0",  // a blocking collective
      "blocking " + ar + " token 1",
      "finished completed " + ar + " token 1",
      "started " + iar + " token 0",  // a non-blocking one, waited for
      "blocking " + iar + " token 2",
      "not_blocking",
      "posted " + iar + " token 2",
      "blocking " + iar + " token 1002",
      "finished waited " + iar + " token 1002",
      "started " + recv + " token 0",  // irecv: no blocking while posting
      "posted " + recv + " token 3",
      "started " + send + " token 0",  // a blocking send
      "blocking " + send + " token 4",
      "finished completed " + send + " token 4",
      "blocking " + recv + " token 1003",
      "finished waited " + recv + " token 1003",
  };
  EXPECT_EQ(rec.calls, expected);
}

TEST(CommObserver, SplitHandsItOnAndARemovedObserverHearsNothing) {
  Recorder rec;
  const auto world = test::runtime().world_group();
  world->add_observer(rec);
  EXPECT_THROW(world->add_observer(rec), Error);
  {
    const auto copy = world->split(0, world->rank(), "copy");
    ASSERT_EQ(rec.groups.size(), 2u);
    EXPECT_EQ(rec.groups[1], copy->name());
    std::vector<float> x(2, 1.0f);
    copy->all_reduce_sum(x);
    if (copy->size() > 1) {
      ASSERT_EQ(rec.calls.size(), 3u);
      EXPECT_EQ(rec.calls[2], fmt::format("finished completed all_reduce seq 1 bytes 8 peer -1 "
                                          "group 102 token 1"));
    }
  }
  EXPECT_EQ(rec.removed, std::vector<std::uint64_t>{102});
  world->remove_observer(rec);
  EXPECT_EQ(rec.removed, (std::vector<std::uint64_t>{102, 101}));
  const std::size_t before = rec.calls.size();
  world->barrier();
  EXPECT_EQ(rec.calls.size(), before);
}

}  // namespace
}  // namespace meshtrain
