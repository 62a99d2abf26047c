// src/meshtrain/train/fault_injector.h
//
// Fault injection (docs/resilience.md, "Fault injection"; the idea of Megatron-core's fault
// injector): the [fault_injection] settings turned into faults at three named points of the
// trainer's step — at step start (a killed or a hung rank), at the start of a forward or
// backward call (a slow rank) and after the gradient reductions, before the checks (a
// non-finite gradient). The production API carries no test hooks: tests and users rehearse
// the same faults through the same documented settings. Every fault prints one line starting
// "fault_injection: " on the rank that injects it, so a log shows it was a rehearsal.
// Faults are injected only on a job's first attempt (restart_count_from_env() == 0): a job
// that `meshtrain launch` or Slurm restarts recovers instead of failing the same way again.
// Uses: config/, core/restart_count.h, train/straggler.h (Phase). Knows nothing of the model or the
// groups.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "meshtrain/config/config.h"
#include "meshtrain/core/restart_count.h"
#include "meshtrain/train/straggler.h"

namespace meshtrain {

class FaultInjector {
 public:
  /// The faults of `config` that world rank `world_rank` injects; none when `restart_count`
  /// > 0 (then the ranks that would inject one say so once).
  FaultInjector(const FaultInjectionConfig& config, int world_rank, int restart_count);

  /// What this rank does at the start of 1-based step `step` (pure: unit tests ask it).
  enum class StepFault { none, kill, hang };
  StepFault step_fault(std::int64_t step) const;
  /// Seconds this rank sleeps at the start of every call of `phase` (0: none).
  double phase_delay_s(Phase phase) const;
  /// The value this rank writes into its first gradient element after the reductions of
  /// 1-based step `step`, or nothing.
  std::optional<float> nonfinite_grad(std::int64_t step) const;

  /// Start of step `step`: a killed rank raises SIGKILL on itself; a hung one sleeps forever.
  void at_step_start(std::int64_t step) const;
  /// Start of a forward or backward call: a slow rank sleeps (the first call says so).
  void at_phase_start(Phase phase);
  /// After the reductions of step `step`, before the checks: writes the non-finite value
  /// into `grad[0]` (this rank's first non-empty gradient; empty when it has none).
  void after_grad_reduction(std::int64_t step, std::span<float> grad) const;

 private:
  FaultInjectionConfig config_;
  int rank_;
  bool armed_;              // first attempt: faults are injected
  bool slow_said_ = false;  // the slow rank's line is printed once, not per call
};

}  // namespace meshtrain
