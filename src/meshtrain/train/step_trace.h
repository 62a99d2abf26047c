// src/meshtrain/train/step_trace.h
//
// `meshtrain train --trace FILE` (docs/tracing.md): the trainer's side of the trace recorder
// (core/trace.h; monitor/trace_observer.h adds the operations). It records the first `steps`
// steps of the run on every rank — the phases of each step, its transformer blocks and every
// ProcessGroup operation — plus, per step, what the byte counters of every group counted
// inside the step's metrics window (the window the --metrics line's comm bytes cover). At
// the end every rank's buffer goes to rank 0, which writes one Chrome-trace JSON file (Trace
// Event Format: "X" complete events, ts/dur in µs; "M" metadata naming a process per rank and
// its two threads) atomically (StagedFile).
//
// Clock: every rank reads CLOCK_MONOTONIC once right after a world barrier (start()). Ranks on
// rank 0's host share that clock, so their times are placed exactly on rank 0's; a rank on
// another host is placed by its own reading after the barrier (the offset method; error ≤ the
// barrier's exit skew plus one network latency, see docs/tracing.md).
//
// Memory: at most `steps` steps and kCapacity events per rank are held (a 10k-step run traces
// its first steps only); events beyond the capacity are counted and the file says how many were
// dropped. Without --trace nothing is recorded (the hooks test one flag).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/monitor/trace_observer.h"

namespace meshtrain {

class StepTrace {
 public:
  /// Events held per rank at most (56 bytes each: 14 MiB).
  static constexpr std::size_t kCapacity = std::size_t{1} << 18;

  /// Off (every call returns at once) when `path` is empty; records the first `steps` steps.
  /// `comm` (attached to the traced groups) names their groups and reads their byte counters;
  /// it must outlive this object.
  StepTrace(std::string path, std::int64_t steps, bool log, const TraceObserver& comm);
  ~StepTrace();
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  bool on() const noexcept { return !path_.empty(); }
  /// The common time origin: a barrier over `world`, then this rank's clock. Collective.
  void start(ProcessGroup& world);
  /// Step `step` (0-based) begins: recording starts if it is among the traced steps.
  void begin_step(std::int64_t step);
  /// The metrics window of the step opens / closes (Trainer::train_step's comm snapshots):
  /// operations inside it are marked, and the counters' bytes in it are kept per group.
  void open_window();
  void close_window();
  /// The step ends (after evaluation and checkpoint): its "step" event; recording pauses.
  void end_step();
  /// Rank 0 writes every rank's events to the file. Collective over `world`.
  void write(ProcessGroup& world, const MeshShape& shape);

 private:
  struct Window {
    std::int64_t step = 0;
    std::int64_t end_ns = 0;
    std::vector<std::int64_t> bytes;  // per trace group id, counted inside the window
  };
  std::string path_;
  std::int64_t steps_;
  bool log_;
  const TraceObserver& comm_;
  std::int64_t first_step_ = -1;
  std::int64_t step_ = 0;
  std::int64_t step_start_ns_ = 0;
  std::int64_t t0_ns_ = 0;
  bool recording_ = false;
  std::vector<std::int64_t> window_start_;
  std::vector<Window> windows_;
};

}  // namespace meshtrain
