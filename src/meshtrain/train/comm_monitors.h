// src/meshtrain/train/comm_monitors.h
//
// CommMonitors: the observers of the trainer's communication (monitor/): the watchdog with its
// flight recorder, and the trace's comm events. They are attached to the world group, watchdog
// first, before the trainer's first collective; every group split from the world (the
// DeviceMesh's, the pipeline's tied-embedding group) inherits them. The trainer declares them
// before its groups so that they outlive every group they watch, and they detach from the
// world (which outlives the trainer) when destroyed. Trainers sharing one world (tests) each
// attach theirs, and a later trainer's groups inherit the earlier ones' too: such trainers
// must end in the reverse order of their construction (as scoped objects do).
#pragma once

#include "meshtrain/comm/process_group.h"
#include "meshtrain/monitor/trace_observer.h"
#include "meshtrain/monitor/watchdog.h"

namespace meshtrain {

class CommMonitors {
 public:
  /// Attaches both to `world`, which must outlive this object.
  explicit CommMonitors(ProcessGroup& world) : world_(world) {
    world_.add_observer(watchdog_);
    world_.add_observer(trace_);
  }
  ~CommMonitors() {
    world_.remove_observer(trace_);
    world_.remove_observer(watchdog_);
  }
  CommMonitors(const CommMonitors&) = delete;
  CommMonitors& operator=(const CommMonitors&) = delete;

  Watchdog& watchdog() noexcept { return watchdog_; }
  const TraceObserver& trace() const noexcept { return trace_; }

 private:
  ProcessGroup& world_;
  Watchdog watchdog_;
  TraceObserver trace_;
};

}  // namespace meshtrain
