// src/meshtrain/comm/comm_observer.h
//
// CommObserver: what a ProcessGroup tells the modules above comm about its operations — the
// watchdog and its flight recorder (monitor/watchdog.h), the trace (monitor/trace_observer.h),
// a test's own observer. A group calls the observers it was given (ProcessGroup::add_observer;
// split() gives the new group its parent's), so comm knows none of them.
//
// The calls, in the order a group makes them for one operation:
//   started      a collective is entered, a send/recv or a non-blocking post begins
//   blocking     the calling thread now blocks on it (a collective always, before the debug
//                check; a blocking send/recv; the wait() of a posted request)
//   not_blocking a non-blocking post is done posting (after `blocking`, for collectives)
//   posted       a non-blocking operation was handed to the backend over [start, end)
//   finished     the operation ended: completed by a blocking call, waited for, found done by
//                test(), or failed (an exception; the debug check rejected it)
// They run on the thread that communicates, on every operation: an observer keeps them to a
// few stores (no lock, no allocation, no system call) and must not throw. Times are
// steady-clock nanoseconds.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "meshtrain/comm/comm_op.h"

namespace meshtrain {

class ProcessGroup;

/// One operation as an observer sees it.
struct CommEvent {
  CommOp op = CommOp::barrier;
  int peer = -1;            // world rank of a send/recv peer, −1 for collectives
  std::uint64_t seq = 0;    // collective: number within the group; p2p: number with that peer
  std::uint64_t bytes = 0;  // the size the byte counters count (ProcessGroup's header)
  std::uint64_t group = 0;  // the observer's own id of the group (group_added's answer)
  std::uint64_t token = 0;  // the observer's own id of the operation (started's, posted's)
};

/// How an operation ended (CommObserver::finished).
enum class CommEnd : std::uint8_t {
  completed,  // a blocking operation returned; [start, end) is its time
  waited,     // a posted request's wait() returned; [start, end) is the wait
  tested,     // a posted request's test() found it done (nothing blocked)
  failed,     // it threw (the debug check rejected it, or the backend failed)
};

class CommObserver {
 public:
  virtual ~CommObserver() = default;
  /// `group` now reports to this observer; returns the id handed back in every CommEvent of it.
  virtual std::uint64_t group_added(const ProcessGroup& group) = 0;
  /// `group` (id `id`) is destroyed or detached: no more calls for it.
  virtual void group_removed(const ProcessGroup& group, std::uint64_t id) noexcept = 0;
  /// Returns the operation's token for the later calls.
  virtual std::uint64_t started(const CommEvent& /*op*/, std::int64_t /*at_ns*/) noexcept {
    return 0;
  }
  virtual void blocking(const CommEvent& /*op*/, std::int64_t /*at_ns*/) noexcept {}
  virtual void not_blocking() noexcept {}
  /// Returns the operation's token from now on (by default the one it has).
  virtual std::uint64_t posted(const CommEvent& op, std::int64_t /*start_ns*/,
                               std::int64_t /*end_ns*/) noexcept {
    return op.token;
  }
  virtual void finished(const CommEvent& /*op*/, CommEnd /*how*/, std::int64_t /*start_ns*/,
                        std::int64_t /*end_ns*/) noexcept {}
};

/// Observers a group holds at most (a fixed array: an operation copies it without allocating).
/// A trainer attaches two to its world; tests keep up to three trainers over one world.
inline constexpr std::size_t kMaxCommObservers = 8;

/// A group's observers with their ids of it, and the calls of one operation to all of them,
/// in the order they were added.
class CommObservers {
 public:
  /// One operation: what every observer is told, and each one's token.
  struct Op {
    CommOp op = CommOp::barrier;
    int peer = -1;
    std::uint64_t seq = 0;
    std::uint64_t bytes = 0;
    std::array<std::uint64_t, kMaxCommObservers> tokens{};
  };

  std::size_t size() const noexcept { return count_; }
  CommObserver& observer(std::size_t i) const noexcept { return *entries_[i].observer; }
  std::uint64_t id(std::size_t i) const noexcept { return entries_[i].id; }
  bool contains(const CommObserver& o) const noexcept;
  /// Appends `o` with its id of the group; false when kMaxCommObservers are held already.
  bool add(CommObserver& o, std::uint64_t id) noexcept;
  /// Drops `o`, keeping the others' order; false when it was not held.
  bool remove(const CommObserver& o) noexcept;

  void started(Op& op, std::int64_t at_ns) const noexcept {
    for (std::size_t i = 0; i < count_; ++i)
      op.tokens[i] = observer(i).started(event(op, i), at_ns);
  }
  void blocking(const Op& op, std::int64_t at_ns) const noexcept {
    for (std::size_t i = 0; i < count_; ++i) observer(i).blocking(event(op, i), at_ns);
  }
  void not_blocking() const noexcept {
    for (std::size_t i = 0; i < count_; ++i) observer(i).not_blocking();
  }
  void posted(Op& op, std::int64_t start_ns, std::int64_t end_ns) const noexcept {
    for (std::size_t i = 0; i < count_; ++i) {
      op.tokens[i] = observer(i).posted(event(op, i), start_ns, end_ns);
    }
  }
  void finished(const Op& op, CommEnd how, std::int64_t start_ns,
                std::int64_t end_ns) const noexcept {
    for (std::size_t i = 0; i < count_; ++i) {
      observer(i).finished(event(op, i), how, start_ns, end_ns);
    }
  }

 private:
  CommEvent event(const Op& op, std::size_t i) const noexcept {
    return {.op = op.op,
            .peer = op.peer,
            .seq = op.seq,
            .bytes = op.bytes,
            .group = entries_[i].id,
            .token = op.tokens[i]};
  }
  struct Entry {
    CommObserver* observer = nullptr;
    std::uint64_t id = 0;
  };
  std::array<Entry, kMaxCommObservers> entries_{};
  std::size_t count_ = 0;
};

}  // namespace meshtrain
