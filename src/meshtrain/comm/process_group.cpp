#include "meshtrain/comm/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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

void ProcessGroup::all_reduce_sum(std::span<float> x) {
  if (size() == 1) return;
  const CallTimer timer = count(CommOp::all_reduce, x.size_bytes());
  do_all_reduce_sum(x);
}

void ProcessGroup::all_reduce_sum(std::span<double> x) {
  if (size() == 1) return;
  const CallTimer timer = count(CommOp::all_reduce, x.size_bytes());
  do_all_reduce_sum(x);
}

void ProcessGroup::all_reduce_max(std::span<float> x) {
  if (size() == 1) return;
  const CallTimer timer = count(CommOp::all_reduce, x.size_bytes());
  do_all_reduce_max(x);
}

void ProcessGroup::broadcast(std::span<std::byte> x, int root) {
  MT_CHECK(root >= 0 && root < size(), "broadcast root {} outside {}", root, name_);
  if (size() == 1) return;
  const CallTimer timer = count(CommOp::broadcast, x.size_bytes());
  do_broadcast(x, root);
}

void ProcessGroup::barrier() {
  if (size() == 1) return;
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
  const CallTimer timer = count(CommOp::all_gather, in.size_bytes());
  return std::make_unique<TimedRequest>(do_iall_gather(in, out), timer.counter);
}

}  // namespace meshtrain
