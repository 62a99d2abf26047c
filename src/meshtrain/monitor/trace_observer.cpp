#include "meshtrain/monitor/trace_observer.h"

#include <algorithm>

#include "meshtrain/core/trace.h"

namespace meshtrain {
namespace {

// The trace's record of an operation of group `group`: [start, end), blocked `wait` ns.
trace::Event traced(trace::Kind kind, const CommEvent& op, std::uint64_t bytes, std::int64_t start,
                    std::int64_t end, std::int64_t wait) {
  trace::Event e;
  e.kind = kind;
  e.op = static_cast<std::uint8_t>(op.op);
  e.group = static_cast<std::int32_t>(op.group);
  e.peer = op.peer;
  e.bytes = static_cast<std::int64_t>(bytes);
  e.start_ns = start;
  e.end_ns = end;
  e.wait_ns = wait;
  return e;
}

}  // namespace

std::uint64_t TraceObserver::group_added(const ProcessGroup& group) {
  const std::lock_guard lock(mutex_);
  const auto [it, added] = ids_.try_emplace(group.name(), static_cast<std::int32_t>(names_.size()));
  if (added) names_.push_back(group.name());
  live_.push_back(&group);
  return static_cast<std::uint64_t>(it->second);
}

void TraceObserver::group_removed(const ProcessGroup& group, std::uint64_t /*id*/) noexcept {
  const std::lock_guard lock(mutex_);
  std::erase(live_, &group);
}

std::uint64_t TraceObserver::posted(const CommEvent& op, std::int64_t start_ns,
                                    std::int64_t end_ns) noexcept {
  if (!trace::enabled()) return static_cast<std::uint64_t>(-1);
  trace::Event e = traced(trace::Kind::comm, op, op.bytes, start_ns, end_ns, 0);
  e.nonblocking = true;
  return static_cast<std::uint64_t>(trace::record(e));
}

void TraceObserver::finished(const CommEvent& op, CommEnd how, std::int64_t start_ns,
                             std::int64_t end_ns) noexcept {
  if (!trace::enabled()) return;
  if (how == CommEnd::completed) {
    trace::record(traced(trace::Kind::comm, op, op.bytes, start_ns, end_ns, end_ns - start_ns));
  } else if (how == CommEnd::waited) {  // the wait, on the posting's record and as its own span
    trace::add_wait(static_cast<std::int64_t>(op.token), end_ns - start_ns);
    trace::record(traced(trace::Kind::comm_wait, op, 0, start_ns, end_ns, end_ns - start_ns));
  }
}

std::vector<std::string> TraceObserver::group_names() const {
  const std::lock_guard lock(mutex_);
  return names_;
}

std::vector<std::int64_t> TraceObserver::counted_bytes() const {
  const std::lock_guard lock(mutex_);
  std::vector<std::int64_t> bytes(names_.size(), 0);
  for (const ProcessGroup* g : live_) {
    const std::int32_t id = ids_.find(g->name())->second;
    for (std::size_t op = 0; op < kNumCommOps; ++op) {
      bytes[static_cast<std::size_t>(id)] += g->counter(static_cast<CommOp>(op)).bytes;
    }
  }
  return bytes;
}

}  // namespace meshtrain
