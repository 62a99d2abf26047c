// src/meshtrain/train/reporting.h
//
// What a run tells the outside: the log line (with elapsed time and ETA), the JSON metrics
// line and the TensorBoard scalars of each step (rank 0), the end-of-run summary, the
// straggler window (every rank's seconds per phase, compared every
// training.straggler_interval steps), the peak-memory table at the end, and the per-group
// communication counters that StepMetrics reports.
// Uses: comm/ (counters, the world), core/ (allocator stats). Knows nothing of models or
// optimizers: it reads StepMetrics and executed actions.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/config/config.h"
#include "meshtrain/parallel/pp/executor.h"
#include "meshtrain/train/progress.h"
#include "meshtrain/train/straggler.h"
#include "meshtrain/train/tensorboard.h"
#include "meshtrain/train/trainer_options.h"

namespace meshtrain {

/// Bytes and seconds of every operation of each group that StepMetrics reports, so far.
struct CommSnapshot {
  CommCounter tp, dp, cp, ep;  // dp: the dp group and, under cp, the dp × cp group
  double attention_s = 0.0;    // this rank's attention layers' core kernel seconds
};
/// The counters of `mesh`'s groups, with `attention_s` as given (the caller sums its
/// attention layers' counters: PipelineStage::attention_core_seconds).
CommSnapshot comm_snapshot(const DeviceMesh& mesh, double attention_s);
/// StepMetrics' *_comm_bytes and *_comm_s: what happened between `before` and `after`.
void set_comm_metrics(const CommSnapshot& before, const CommSnapshot& after, StepMetrics& m);

/// The TensorBoard scalars of one metrics line (docs/observability.md lists the tags): every
/// number and bool of `line` except "step", under "<group>/<key>" — val_loss as "val/loss",
/// MoE layer fields as "moe/layer_<l>/<field>" (per-expert lists "…/<field>/<e>"), the
/// straggler list as "stragglers/count".
std::vector<TensorBoardScalar> tensorboard_scalars(const nlohmann::json& line);

class Reporting {
 public:
  /// Opens options.metrics_path on rank 0 (appending when the run resumes: the steps it
  /// repeats appear twice, the later line being the resumed run's), and under
  /// options.tensorboard_dir a new event file holding the resolved config (config/load.h
  /// to_toml) as text "config" at step 0. `tied_group` (or nullptr)
  /// is counted in comm_seconds with the mesh's groups; `predicted_bubble` is logged beside
  /// the measured one.
  Reporting(const Config& config, const TrainerOptions& options, ProcessGroup& world,
            const DeviceMesh& mesh, const ProcessGroup* tied_group, double predicted_bubble);
  Reporting(const Reporting&) = delete;
  Reporting& operator=(const Reporting&) = delete;

  /// The time origin of the run: a barrier over the world (one clock per machine), then now.
  void start_clock();
  /// Seconds since start_clock().
  double seconds_since_start() const;

  /// Seconds this rank has spent inside collectives, over all its groups.
  double comm_seconds() const;
  /// Times phases minus the collectives inside them (the straggler report's clock).
  const PhaseClock& clock() const { return clock_; }
  /// Runs `fn` as this rank's optimizer phase of the window.
  template <typename Fn>
  auto time_optimizer(Fn&& fn) {
    return clock_.time(Phase::optimizer, window_, std::forward<Fn>(fn));
  }
  /// End of a step that started when comm_seconds() was `comm_start`: its time in collectives
  /// goes to the window's comm_wait.
  void end_step(double comm_start);
  /// End of a straggler window: all-gathers every rank's phase seconds (this rank's data,
  /// forward and backward are `runner_phases`), finds the stragglers, and clears the window
  /// and `runner_phases`. Collective over the world.
  std::vector<Straggler> straggler_report(PhaseSeconds& runner_phases);

  /// Rank 0 prints every rank's peak bytes per memory category (and keeps the largest total
  /// for the summary). Collective over the world.
  void report_peak_memory();
  /// The log line (rank 0, every log_interval steps, the first and evaluated ones, and the
  /// straggler report), the metrics line and the TensorBoard scalars of one step; the
  /// TensorBoard file is flushed after each step.
  void log_step(const StepMetrics& m);
  /// End of the run, after report_peak_memory(): rank 0 prints the summary and closes the
  /// TensorBoard file (fsync).
  void finish_run();

 private:
  void print_stragglers(const StepMetrics& m) const;
  /// The host world rank `world_rank` runs on ("?" before the names are gathered).
  std::string host_of(int world_rank) const;
  /// Runs `write` on the TensorBoard file; a DataError is a warning and ends the file.
  void tensorboard_write(const std::function<void()>& write);
  nlohmann::json metrics_line(const StepMetrics& m, double elapsed_s, double eta_s) const;

  const Config& config_;
  const TrainerOptions& options_;
  ProcessGroup& world_;
  const DeviceMesh& mesh_;
  const ProcessGroup* tied_group_;
  double predicted_bubble_;
  std::ofstream metrics_;
  PhaseClock clock_;
  PhaseSeconds window_;  // optimizer and comm_wait; data/forward/backward live in the runner
  std::int64_t window_steps_ = 0;
  std::chrono::steady_clock::time_point t0_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // rank 0 under --tensorboard
  EtaEstimator eta_;
  RunSummary summary_;
  double last_step_end_s_ = 0.0;  // seconds_since_start() when the previous step was logged
  std::vector<std::string> hosts_;  // host name of every world rank (rank 0), for the reports
};

}  // namespace meshtrain
