// src/meshtrain/monitor/trace_observer.h
//
// TraceObserver: the comm side of `meshtrain train --trace` (docs/tracing.md). Attached to a
// group (the trainer attaches it to the world, and every group split from it inherits it), it
// records each operation into the trace buffer (core/trace.h) while the trace records — a
// blocking operation as one `comm` event with its bytes and wait, a non-blocking one as the
// `comm` event of its posting and, when its wait() blocked, a `comm_wait` event whose time is
// also added to the posting's wait — and numbers the groups by name for the events. It also
// keeps the live groups, so that train/step_trace.h can read how many bytes each has counted.
// When the trace is off, each call costs one relaxed load and a branch.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/comm/comm_observer.h"
#include "meshtrain/comm/process_group.h"

namespace meshtrain {

class TraceObserver final : public CommObserver {
 public:
  std::uint64_t group_added(const ProcessGroup& group) override;
  void group_removed(const ProcessGroup& group, std::uint64_t id) noexcept override;
  std::uint64_t posted(const CommEvent& op, std::int64_t start_ns,
                       std::int64_t end_ns) noexcept override;
  void finished(const CommEvent& op, CommEnd how, std::int64_t start_ns,
                std::int64_t end_ns) noexcept override;

  /// Every group name seen, by the index the events carry (trace::Event::group); names are
  /// added when a group of a new name is added, never removed.
  std::vector<std::string> group_names() const;
  /// Per group index: the bytes its live groups have counted so far (every operation), summed.
  std::vector<std::int64_t> counted_bytes() const;

 private:
  // Groups are made and destroyed on any thread (tests build meshes in threads): locked.
  mutable std::mutex mutex_;
  std::vector<std::string> names_;
  std::map<std::string, std::int32_t, std::less<>> ids_;
  std::vector<const ProcessGroup*> live_;
};

}  // namespace meshtrain
