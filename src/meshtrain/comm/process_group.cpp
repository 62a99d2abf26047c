#include "meshtrain/comm/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>

#include "meshtrain/core/error.h"

namespace meshtrain {

std::string_view to_string(CommOp op) {
  switch (op) {
    case CommOp::all_reduce:
      return "all_reduce";
    case CommOp::broadcast:
      return "broadcast";
    case CommOp::barrier:
      return "barrier";
    case CommOp::reduce_scatter:
      return "reduce_scatter";
    case CommOp::all_gather:
      return "all_gather";
    case CommOp::all_to_all:
      return "all_to_all";
    case CommOp::send:
      return "send";
    case CommOp::recv:
      return "recv";
  }
  return "unknown";
}

namespace {
// Steady-clock nanoseconds: the clock of the seconds counters and of every observer call.
std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

ProcessGroup::ProcessGroup(int rank, std::vector<int> world_ranks, std::string axis_name)
    : sent_(world_ranks.size(), 0),
      received_(world_ranks.size(), 0),
      rank_(rank),
      world_ranks_(std::move(world_ranks)),
      name_(fmt::format("{}{{{}}}", axis_name, fmt::join(world_ranks_, ","))) {}

ProcessGroup::~ProcessGroup() {
  for (std::size_t i = 0; i < observers_.size(); ++i) {
    observers_.observer(i).group_removed(*this, observers_.id(i));
  }
}

std::unique_ptr<ProcessGroup> ProcessGroup::split(int color, int key, std::string axis_name) const {
  std::unique_ptr<ProcessGroup> group = do_split(color, key, std::move(axis_name));
  group->debug_checks_ = debug_checks_;
  for (std::size_t i = 0; i < observers_.size(); ++i) group->add_observer(observers_.observer(i));
  return group;
}

void ProcessGroup::add_observer(CommObserver& observer) {
  if (observers_.contains(observer)) {
    throw Error(fmt::format("this observer already watches {}", name_));
  }
  if (observers_.size() == kMaxCommObservers) {
    throw Error(fmt::format("{} has {} observers already, the most a group takes", name_,
                            kMaxCommObservers));
  }
  observers_.add(observer, observer.group_added(*this));
}

void ProcessGroup::remove_observer(CommObserver& observer) noexcept {
  for (std::size_t i = 0; i < observers_.size(); ++i) {
    if (&observers_.observer(i) != &observer) continue;
    observer.group_removed(*this, observers_.id(i));
    observers_.remove(observer);
    return;
  }
}

ProcessGroup::OpGuard::OpGuard(ProcessGroup& g, CommOp o, int call, std::size_t elements,
                               std::size_t n_bytes, int root, bool blocking)
    : group(g),
      counter(g.counters_[static_cast<std::size_t>(o)]),
      op{.op = o, .peer = -1, .seq = ++g.collective_seq_, .bytes = n_bytes},
      blocks(blocking) {
  const CommObservers& observers = g.observers_;
  start_ns = now_ns();
  observers.started(op, start_ns);
  // The debug check is itself an all-reduce that a missing rank leaves hanging: watched too.
  observers.blocking(op, start_ns);
  try {
    g.check_call(call, elements, root);
  } catch (...) {
    observers.finished(op, CommEnd::failed, start_ns, now_ns());
    throw;
  }
  if (!blocks) observers.not_blocking();  // posted: the request's wait() is watched
  counter.calls += 1;
  counter.bytes += static_cast<std::int64_t>(op.bytes);
  counted = true;
  // The seconds counter leaves the debug comparison out (it measures the operation itself).
  if (g.debug_checks_) start_ns = now_ns();
}

ProcessGroup::OpGuard::OpGuard(ProcessGroup& g, CommOp o, int peer, std::size_t n_bytes,
                               bool blocking)
    : group(g),
      counter(g.counters_[static_cast<std::size_t>(o)]),
      op{.op = o,
         .peer = g.world_ranks_[static_cast<std::size_t>(peer)],
         .seq = ++(o == CommOp::send ? g.sent_ : g.received_)[static_cast<std::size_t>(peer)],
         .bytes = n_bytes},
      blocks(blocking) {
  start_ns = now_ns();
  g.observers_.started(op, start_ns);
  if (blocks) g.observers_.blocking(op, start_ns);
  counter.calls += 1;
  counter.bytes += static_cast<std::int64_t>(op.bytes);
  counted = true;
}

ProcessGroup::OpGuard::~OpGuard() {
  if (!counted || !blocks) return;
  const std::int64_t end = now_ns();
  counter.seconds += static_cast<double>(end - start_ns) * 1e-9;
  group.observers_.finished(op, CommEnd::completed, start_ns, end);
}

namespace {

// The collectives OpGuard numbers, by the index it is given.
constexpr std::array<std::string_view, 17> kCallNames = {"all_reduce_sum(f32)",
                                                         "all_reduce_sum(f64)",
                                                         "all_reduce_max(f32)",
                                                         "broadcast(bytes)",
                                                         "barrier",
                                                         "reduce_scatter_sum(f32)",
                                                         "all_gather(f32)",
                                                         "all_to_all(f32)",
                                                         "iall_gather(f32)",
                                                         "all_to_allv(f32)",
                                                         "iall_reduce_sum(f32)",
                                                         "ireduce_scatter_sum(f32)",
                                                         "all_reduce_sum(i32)",
                                                         "all_reduce_sum(i64)",
                                                         "all_reduce_max(i32)",
                                                         "all_gather(i32)",
                                                         "all_to_all(i32)"};

}  // namespace

void ProcessGroup::check_call(int call, std::size_t elements, int root) {
  if (!debug_checks_) return;
  // Every rank writes its call into its own row and the sum fills the table on every rank:
  // the same verdict everywhere, so either all ranks go on or all throw (none is left waiting).
  constexpr std::size_t kFields = 4;
  const auto n = static_cast<std::size_t>(size());
  std::vector<double> table(kFields * n, 0.0);
  double* mine = table.data() + kFields * static_cast<std::size_t>(rank_);
  mine[0] = call;
  mine[1] = static_cast<double>(elements);
  mine[2] = root;
  mine[3] = static_cast<double>(collective_seq_);
  do_all_reduce_sum(std::span<double>(table));
  bool same = true;
  for (std::size_t r = 1; r < n; ++r) {
    same = same && std::equal(table.begin(), table.begin() + kFields,
                              table.begin() + static_cast<std::ptrdiff_t>(kFields * r));
  }
  if (same) return;
  std::string calls;
  for (std::size_t r = 0; r < n; ++r) {
    const double* t = table.data() + kFields * r;
    const auto index = static_cast<std::size_t>(t[0]);
    calls += fmt::format("\n  group rank {} (world rank {}): collective #{} {} of {} elements{}", r,
                         world_ranks_[r], static_cast<std::uint64_t>(t[3]),
                         index < kCallNames.size() ? kCallNames[index] : "unknown",
                         static_cast<std::uint64_t>(t[1]),
                         t[2] >= 0 ? fmt::format(", root {}", static_cast<int>(t[2])) : "");
  }
  throw Error(fmt::format(
      "mismatched collective on {} (parallel.debug_collectives): the ranks called{}\nfix the "
      "code path that makes one rank call a different collective, size or root",
      name_, calls));
}

template <bool Max, typename T>
void ProcessGroup::reduce(std::span<T> x, int call) {
  if (size() == 1) return;
  const OpGuard guard(*this, CommOp::all_reduce, call, x.size(), x.size_bytes(), -1);
  if constexpr (Max) {
    do_all_reduce_max(x);
  } else {
    do_all_reduce_sum(x);
  }
}

void ProcessGroup::all_reduce_sum(std::span<float> x) { reduce<false>(x, 0); }
void ProcessGroup::all_reduce_sum(std::span<double> x) { reduce<false>(x, 1); }
void ProcessGroup::all_reduce_sum(std::span<std::int32_t> x) { reduce<false>(x, 12); }
void ProcessGroup::all_reduce_sum(std::span<std::int64_t> x) { reduce<false>(x, 13); }
void ProcessGroup::all_reduce_max(std::span<float> x) { reduce<true>(x, 2); }
void ProcessGroup::all_reduce_max(std::span<std::int32_t> x) { reduce<true>(x, 14); }

void ProcessGroup::broadcast(std::span<std::byte> x, int root) {
  MT_CHECK(root >= 0 && root < size(), "broadcast root {} outside {}", root, name_);
  if (size() == 1) return;
  const OpGuard guard(*this, CommOp::broadcast, 3, x.size(), x.size_bytes(), root);
  do_broadcast(x, root);
}

void ProcessGroup::barrier() {
  if (size() == 1) return;
  const OpGuard guard(*this, CommOp::barrier, 4, 0, 0, -1);
  do_barrier();
}

void ProcessGroup::reduce_scatter_sum(std::span<const float> in, std::span<float> out) {
  MT_CHECK(in.size() == out.size() * static_cast<std::size_t>(size()),
           "reduce_scatter on {}: input {} elements, output {}", name_, in.size(), out.size());
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  const OpGuard guard(*this, CommOp::reduce_scatter, 5, in.size(), in.size_bytes(), -1);
  do_reduce_scatter_sum(in, out);
}

template <typename T>
void ProcessGroup::gather(std::span<const T> in, std::span<T> out, int call) {
  MT_CHECK(out.size() == in.size() * static_cast<std::size_t>(size()),
           "all_gather on {}: input {} elements, output {}", name_, in.size(), out.size());
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  const OpGuard guard(*this, CommOp::all_gather, call, in.size(), in.size_bytes(), -1);
  do_all_gather(in, out);
}

void ProcessGroup::all_gather(std::span<const float> in, std::span<float> out) {
  gather(in, out, 6);
}
void ProcessGroup::all_gather(std::span<const std::int32_t> in, std::span<std::int32_t> out) {
  gather(in, out, 15);
}

template <typename T>
void ProcessGroup::exchange(std::span<const T> in, std::span<T> out, int call) {
  MT_CHECK(in.size() == out.size() && in.size() % static_cast<std::size_t>(size()) == 0,
           "all_to_all on {}: input {} elements, output {}", name_, in.size(), out.size());
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  const OpGuard guard(*this, CommOp::all_to_all, call, in.size(), in.size_bytes(), -1);
  do_all_to_all(in, out);
}

void ProcessGroup::all_to_all(std::span<const float> in, std::span<float> out) {
  exchange(in, out, 7);
}
void ProcessGroup::all_to_all(std::span<const std::int32_t> in, std::span<std::int32_t> out) {
  exchange(in, out, 16);
}

void ProcessGroup::all_to_allv(std::span<const float> in, std::span<const std::int64_t> send_counts,
                               std::span<float> out, std::span<const std::int64_t> recv_counts) {
  const auto n = static_cast<std::size_t>(size());
  MT_CHECK(send_counts.size() == n && recv_counts.size() == n,
           "all_to_allv on {}: {} send and {} receive counts for {} ranks", name_,
           send_counts.size(), recv_counts.size(), n);
  std::int64_t sent = 0, received = 0;
  for (std::size_t r = 0; r < n; ++r) {
    MT_CHECK(send_counts[r] >= 0 && recv_counts[r] >= 0, "all_to_allv on {}: negative count",
             name_);
    sent += send_counts[r];
    received += recv_counts[r];
  }
  MT_CHECK(static_cast<std::int64_t>(in.size()) == sent &&
               static_cast<std::int64_t>(out.size()) == received,
           "all_to_allv on {}: input {} elements for counts summing to {}, output {} for {}", name_,
           in.size(), sent, out.size(), received);
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  // The call check compares the number of counts (the sizes differ by rank, legitimately).
  const OpGuard guard(*this, CommOp::all_to_all, 9, n, in.size_bytes(), -1);
  check_counts(send_counts, recv_counts);
  do_all_to_allv(in, send_counts, out, recv_counts);
}

void ProcessGroup::check_counts(std::span<const std::int64_t> send_counts,
                                std::span<const std::int64_t> recv_counts) {
  if (!debug_checks_) return;
  // Row r of the summed table: rank r's send counts, then its receive counts; every rank
  // checks every pair, so all reach the same verdict.
  const auto n = static_cast<std::size_t>(size());
  std::vector<double> table(2 * n * n, 0.0);
  double* mine = table.data() + 2 * n * static_cast<std::size_t>(rank_);
  for (std::size_t r = 0; r < n; ++r) {
    mine[r] = static_cast<double>(send_counts[r]);
    mine[n + r] = static_cast<double>(recv_counts[r]);
  }
  do_all_reduce_sum(std::span<double>(table));
  std::string pairs;
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b) {
      const double sends = table[2 * n * a + b], expects = table[2 * n * b + n + a];
      if (sends == expects) continue;
      pairs +=
          fmt::format("\n  group rank {} sends {} elements to group rank {}, which expects {}", a,
                      static_cast<std::int64_t>(sends), b, static_cast<std::int64_t>(expects));
    }
  }
  if (pairs.empty()) return;
  throw Error(fmt::format(
      "mismatched all_to_allv counts on {} (parallel.debug_collectives):{}\nfix the code path "
      "that computes the receive counts: they must come from the exchanged send counts",
      name_, pairs));
}

void ProcessGroup::send(std::span<const float> x, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "send to {} on {}", peer, name_);
  const OpGuard guard(*this, CommOp::send, peer, x.size_bytes());
  do_send(x, peer, tag);
}

void ProcessGroup::recv(std::span<float> x, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "recv from {} on {}", peer, name_);
  const OpGuard guard(*this, CommOp::recv, peer, x.size_bytes());
  do_recv(x, peer, tag);
}

namespace {
// Adds the time spent waiting to the operation's counter, and tells the group's observers.
class TimedRequest final : public CommRequest {
 public:
  TimedRequest(std::unique_ptr<CommRequest> inner, CommCounter& counter,
               const CommObservers& observers, const CommObservers::Op& op)
      : inner_(std::move(inner)), counter_(counter), observers_(observers), op_(op) {}
  ~TimedRequest() override {
    try {
      wait();
    } catch (...) {  // a destructor must not throw; the transfer failed and MPI says so already
    }
  }
  void wait() override {
    if (done_) return;
    const std::int64_t start = now_ns();
    observers_.blocking(op_, start);
    try {
      inner_->wait();
    } catch (...) {
      observers_.finished(op_, CommEnd::failed, start, now_ns());
      throw;
    }
    done_ = true;
    const std::int64_t end = now_ns();
    observers_.finished(op_, CommEnd::waited, start, end);
    counter_.seconds += static_cast<double>(end - start) * 1e-9;
  }
  bool test() override {
    if (!done_ && inner_->test()) {
      done_ = true;
      const std::int64_t now = now_ns();
      observers_.finished(op_, CommEnd::tested, now, now);
    }
    return done_;
  }
  std::optional<NonFiniteInput> first_non_finite_input() const override {
    return inner_->first_non_finite_input();
  }

 private:
  std::unique_ptr<CommRequest> inner_;
  CommCounter& counter_;
  CommObservers observers_;  // a copy: a fixed array, no allocation
  CommObservers::Op op_;
  bool done_ = false;
};
}  // namespace

std::unique_ptr<CommRequest> ProcessGroup::OpGuard::posted(std::unique_ptr<CommRequest> request) {
  if (group.observers_.size() > 0) group.observers_.posted(op, start_ns, now_ns());
  return std::make_unique<TimedRequest>(std::move(request), counter, group.observers_, op);
}

std::unique_ptr<CommRequest> ProcessGroup::isend(std::span<const float> x, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "isend to {} on {}", peer, name_);
  OpGuard guard(*this, CommOp::send, peer, x.size_bytes(), /*blocks=*/false);
  return guard.posted(do_isend(x, peer, tag));
}

std::unique_ptr<CommRequest> ProcessGroup::irecv(std::span<float> x, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "irecv from {} on {}", peer, name_);
  OpGuard guard(*this, CommOp::recv, peer, x.size_bytes(), /*blocks=*/false);
  return guard.posted(do_irecv(x, peer, tag));
}

namespace {
// A one-rank group's non-blocking collective completes when posted.
class CompletedRequest final : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};
}  // namespace

std::unique_ptr<CommRequest> ProcessGroup::iall_gather(std::span<const float> in,
                                                       std::span<float> out) {
  MT_CHECK(out.size() == in.size() * static_cast<std::size_t>(size()),
           "iall_gather on {}: input {} elements, output {}", name_, in.size(), out.size());
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return std::make_unique<CompletedRequest>();
  }
  OpGuard guard(*this, CommOp::all_gather, 8, in.size(), in.size_bytes(), -1,
                /*blocks=*/false);
  return guard.posted(do_iall_gather(in, out));
}

Tensor ProcessGroup::allocate_shared(std::int64_t count, MemCategory category) {
  MT_CHECK(count >= 0, "allocate_shared: {} elements", count);
  if (size() == 1) return {};
  return do_allocate_shared(count, category);
}

Tensor ProcessGroup::do_allocate_shared(std::int64_t /*count*/, MemCategory /*category*/) {
  return {};  // a backend without shared memory: iall_reduce_sum sends messages
}

std::unique_ptr<CommRequest> ProcessGroup::iall_reduce_sum(std::span<float> x, float scale) {
  if (size() == 1) {
    if (scale != 1.0f) {
      for (float& v : x) v *= scale;
    }
    return std::make_unique<CompletedRequest>();
  }
  OpGuard guard(*this, CommOp::all_reduce, 10, x.size(), x.size_bytes(), -1,
                /*blocks=*/false);
  return guard.posted(do_iall_reduce_sum(x, scale));
}

std::unique_ptr<CommRequest> ProcessGroup::ireduce_scatter_sum(std::span<float> in,
                                                               std::span<float> out) {
  MT_CHECK(in.size() == out.size() * static_cast<std::size_t>(size()),
           "ireduce_scatter on {}: input {} elements, output {}", name_, in.size(), out.size());
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return std::make_unique<CompletedRequest>();
  }
  OpGuard guard(*this, CommOp::reduce_scatter, 11, in.size(), in.size_bytes(), -1,
                /*blocks=*/false);
  return guard.posted(do_ireduce_scatter_sum(in, out));
}

}  // namespace meshtrain
