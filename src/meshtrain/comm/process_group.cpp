#include "meshtrain/comm/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>

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

ProcessGroup::ProcessGroup(int rank, std::vector<int> world_ranks, std::string axis_name)
    : rank_(rank),
      world_ranks_(std::move(world_ranks)),
      name_(fmt::format("{}{{{}}}", axis_name, fmt::join(world_ranks_, ","))) {}

ProcessGroup::CallTimer ProcessGroup::count(CommOp op, std::size_t bytes) noexcept {
  CommCounter& c = counters_[static_cast<std::size_t>(op)];
  c.calls += 1;
  c.bytes += static_cast<std::int64_t>(bytes);
  return CallTimer(c);
}

ProcessGroup::CallTimer::~CallTimer() {
  counter.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

namespace {

std::atomic<bool> debug_checks_on{false};

// The collectives enter() numbers, by the index it is given.
constexpr std::array<std::string_view, 9> kCallNames = {"all_reduce_sum(f32)",
                                                        "all_reduce_sum(f64)",
                                                        "all_reduce_max(f32)",
                                                        "broadcast(bytes)",
                                                        "barrier",
                                                        "reduce_scatter_sum(f32)",
                                                        "all_gather(f32)",
                                                        "all_to_all(f32)",
                                                        "iall_gather(f32)"};

}  // namespace

void ProcessGroup::set_debug_checks(bool on) noexcept { debug_checks_on = on; }
bool ProcessGroup::debug_checks() noexcept { return debug_checks_on; }

void ProcessGroup::enter(int call, std::size_t elements, int root) {
  ++collective_seq_;
  if (!debug_checks_on) return;
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

void ProcessGroup::all_reduce_sum(std::span<float> x) {
  if (size() == 1) return;
  enter(0, x.size(), -1);
  const CallTimer timer = count(CommOp::all_reduce, x.size_bytes());
  do_all_reduce_sum(x);
}

void ProcessGroup::all_reduce_sum(std::span<double> x) {
  if (size() == 1) return;
  enter(1, x.size(), -1);
  const CallTimer timer = count(CommOp::all_reduce, x.size_bytes());
  do_all_reduce_sum(x);
}

void ProcessGroup::all_reduce_max(std::span<float> x) {
  if (size() == 1) return;
  enter(2, x.size(), -1);
  const CallTimer timer = count(CommOp::all_reduce, x.size_bytes());
  do_all_reduce_max(x);
}

void ProcessGroup::broadcast(std::span<std::byte> x, int root) {
  MT_CHECK(root >= 0 && root < size(), "broadcast root {} outside {}", root, name_);
  if (size() == 1) return;
  enter(3, x.size(), root);
  const CallTimer timer = count(CommOp::broadcast, x.size_bytes());
  do_broadcast(x, root);
}

void ProcessGroup::barrier() {
  if (size() == 1) return;
  enter(4, 0, -1);
  const CallTimer timer = count(CommOp::barrier, 0);
  do_barrier();
}

void ProcessGroup::reduce_scatter_sum(std::span<const float> in, std::span<float> out) {
  MT_CHECK(in.size() == out.size() * static_cast<std::size_t>(size()),
           "reduce_scatter on {}: input {} elements, output {}", name_, in.size(), out.size());
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  enter(5, in.size(), -1);
  const CallTimer timer = count(CommOp::reduce_scatter, in.size_bytes());
  do_reduce_scatter_sum(in, out);
}

void ProcessGroup::all_gather(std::span<const float> in, std::span<float> out) {
  MT_CHECK(out.size() == in.size() * static_cast<std::size_t>(size()),
           "all_gather on {}: input {} elements, output {}", name_, in.size(), out.size());
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  enter(6, in.size(), -1);
  const CallTimer timer = count(CommOp::all_gather, in.size_bytes());
  do_all_gather(in, out);
}

void ProcessGroup::all_to_all(std::span<const float> in, std::span<float> out) {
  MT_CHECK(in.size() == out.size() && in.size() % static_cast<std::size_t>(size()) == 0,
           "all_to_all on {}: input {} elements, output {}", name_, in.size(), out.size());
  if (size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  enter(7, in.size(), -1);
  const CallTimer timer = count(CommOp::all_to_all, in.size_bytes());
  do_all_to_all(in, out);
}

void ProcessGroup::send(std::span<const float> x, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "send to {} on {}", peer, name_);
  const CallTimer timer = count(CommOp::send, x.size_bytes());
  do_send(x, peer, tag);
}

void ProcessGroup::recv(std::span<float> x, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "recv from {} on {}", peer, name_);
  const CallTimer timer = count(CommOp::recv, x.size_bytes());
  do_recv(x, peer, tag);
}

namespace {
// Adds the time spent waiting to the operation's counter.
class TimedRequest final : public CommRequest {
 public:
  TimedRequest(std::unique_ptr<CommRequest> inner, CommCounter& counter)
      : inner_(std::move(inner)), counter_(counter) {}
  ~TimedRequest() override {
    try {
      wait();
    } catch (...) {  // a destructor must not throw; the transfer failed and MPI says so already
    }
  }
  void wait() override {
    if (done_) return;
    const auto start = std::chrono::steady_clock::now();
    inner_->wait();
    done_ = true;
    counter_.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  bool test() override { return done_ = done_ || inner_->test(); }

 private:
  std::unique_ptr<CommRequest> inner_;
  CommCounter& counter_;
  bool done_ = false;
};
}  // namespace

std::unique_ptr<CommRequest> ProcessGroup::isend(std::span<const float> x, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "isend to {} on {}", peer, name_);
  const CallTimer timer = count(CommOp::send, x.size_bytes());
  return std::make_unique<TimedRequest>(do_isend(x, peer, tag), timer.counter);
}

std::unique_ptr<CommRequest> ProcessGroup::irecv(std::span<float> x, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "irecv from {} on {}", peer, name_);
  const CallTimer timer = count(CommOp::recv, x.size_bytes());
  return std::make_unique<TimedRequest>(do_irecv(x, peer, tag), timer.counter);
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
  enter(8, in.size(), -1);
  const CallTimer timer = count(CommOp::all_gather, in.size_bytes());
  return std::make_unique<TimedRequest>(do_iall_gather(in, out), timer.counter);
}

}  // namespace meshtrain
