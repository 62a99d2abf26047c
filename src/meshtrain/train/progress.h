// src/meshtrain/train/progress.h — the run's progress (elapsed time and ETA of the log line)
// and its end-of-run summary, computed on rank 0 from each step's StepMetrics and wall time.
// Pure arithmetic: no clocks, no collectives (Reporting measures and feeds them).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "meshtrain/train/trainer_options.h"

namespace meshtrain {

/// Estimated time to the end of the run (docs/observability.md, "ETA"):
///   ETA = mean(w_i − e_i over the last kWindow steps) × (steps left)
///       + mean(e_i over the evaluated steps so far) × (evaluations left),
/// where w_i is step i's wall time (from the end of the previous step to the end of this one:
/// training, evaluation, checkpoint and logging) and e_i its evaluation time, taken as
/// w_i − step_time_s − checkpoint_s on a step that evaluated (0 on the others). Evaluations
/// left: the steps after this one that evaluate (every training.eval_interval-th, and the
/// last). Before the first evaluation its cost is unknown and counted as 0.
class EtaEstimator {
 public:
  static constexpr std::size_t kWindow = 20;  // recent steps averaged (steps, not seconds)

  EtaEstimator(std::int64_t max_steps, std::int64_t eval_interval)
      : max_steps_(max_steps), eval_interval_(eval_interval) {}
  /// Step `m.step` (1-based) ended `wall_s` seconds after the previous one.
  void add(const StepMetrics& m, double wall_s);
  /// Seconds left after the last step added (0 after the last step of the run).
  double eta_s() const;
  /// Steps after `step` (1-based) up to max_steps that evaluate.
  std::int64_t evaluations_after(std::int64_t step) const;

 private:
  std::int64_t max_steps_;
  std::int64_t eval_interval_;
  std::int64_t step_ = 0;
  std::deque<double> recent_;  // w_i − e_i of the last kWindow steps
  double eval_s_ = 0.0;        // Σ e_i
  std::int64_t evals_ = 0;
};

/// "H:MM:SS", seconds rounded to the nearest (hours may exceed 24).
std::string format_duration(double seconds);

/// What the run did, accumulated step by step (docs/observability.md, "Summary").
struct RunSummary {
  std::int64_t steps = 0;       // steps this process ran (a resumed run counts its own)
  std::int64_t first_step = 0;  // 1-based
  std::int64_t last_step = 0;
  std::int64_t tokens = 0;   // steps × global batch × block_size
  double step_time_s = 0.0;  // Σ step_time_s (training only)
  double mfu_time_s = 0.0;   // Σ mfu × step_time_s
  double wall_s = 0.0;       // from the start of the loop to the end of the last step
  std::optional<double> best_val_loss;
  std::int64_t best_val_step = 0;
  std::int64_t peak_bytes = 0;  // the tracked allocator's peak, the largest over the ranks
  int peak_rank = 0;

  /// Adds step `m`, which trained `tokens_per_step` tokens and ended `elapsed_s` after the
  /// start of the loop.
  void add(const StepMetrics& m, std::int64_t tokens_per_step, double elapsed_s);
  /// tokens / Σ step_time_s: the per-step definition (StepMetrics::tokens_per_s) over the run.
  double tokens_per_s() const;
  /// Σ mfu_i t_i / Σ t_i: the per-step MFU over the run (tokens_per_s() × FLOP/token / peak).
  double mfu() const;
  /// One line: "summary: N steps (a–b) | T tokens | wall H:MM:SS (S s) | X tokens/s (Y over the
  /// wall time) | MFU M% | best val_loss V at step s | peak memory P MiB (B bytes, rank r)".
  std::string format() const;
};

}  // namespace meshtrain
