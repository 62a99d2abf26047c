#include "meshtrain/train/fault_injector.h"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>

namespace meshtrain {
namespace {

// One line on stderr, unbuffered: a killed rank's line must be out before the signal.
void say(const std::string& line) {
  std::fputs(fmt::format("fault_injection: {}\n", line).c_str(), stderr);
  std::fflush(stderr);
}

Phase phase_of(FaultPhase p) { return p == FaultPhase::forward ? Phase::forward : Phase::backward; }

// The faults `config` gives world rank `rank`, named for the line a restarted rank prints.
std::string faults_of(const FaultInjectionConfig& c, int rank) {
  std::string out;
  const auto add = [&](bool mine, const std::string& what) {
    if (mine) out += (out.empty() ? "" : ", ") + what;
  };
  add(c.nonfinite_grad_step != -1 && c.nonfinite_grad_rank == rank,
      fmt::format("a non-finite gradient at step {}", c.nonfinite_grad_step));
  add(c.slow_rank == rank,
      fmt::format("a sleep of {} s per {} call", c.slow_seconds, to_string(c.slow_phase)));
  add(c.kill_step != -1 && c.kill_rank == rank, fmt::format("SIGKILL at step {}", c.kill_step));
  add(c.hang_step != -1 && c.hang_rank == rank, fmt::format("a hang at step {}", c.hang_step));
  return out;
}

}  // namespace

FaultInjector::FaultInjector(const FaultInjectionConfig& config, int world_rank, int restart_count)
    : config_(config), rank_(world_rank), armed_(restart_count == 0) {
  if (armed_) return;
  if (const std::string mine = faults_of(config_, rank_); !mine.empty()) {
    say(
        fmt::format("rank {}: not injecting {}: this is restart {} of the job, and faults are "
                    "injected on its first attempt only",
                    rank_, mine, restart_count));
  }
}

FaultInjector::StepFault FaultInjector::step_fault(std::int64_t step) const {
  if (!armed_) return StepFault::none;
  if (step == config_.kill_step && rank_ == config_.kill_rank) return StepFault::kill;
  if (step == config_.hang_step && rank_ == config_.hang_rank) return StepFault::hang;
  return StepFault::none;
}

double FaultInjector::phase_delay_s(Phase phase) const {
  const bool slow = armed_ && rank_ == config_.slow_rank && phase == phase_of(config_.slow_phase);
  return slow ? config_.slow_seconds : 0.0;
}

std::optional<float> FaultInjector::nonfinite_grad(std::int64_t step) const {
  if (!armed_ || step != config_.nonfinite_grad_step || rank_ != config_.nonfinite_grad_rank) {
    return std::nullopt;
  }
  return config_.nonfinite_grad_value == FaultValue::nan ? std::numeric_limits<float>::quiet_NaN()
                                                         : std::numeric_limits<float>::infinity();
}

void FaultInjector::at_step_start(std::int64_t step) const {
  switch (step_fault(step)) {
    case StepFault::kill:
      say(fmt::format("rank {} raises SIGKILL on itself at the start of step {}", rank_, step));
      std::raise(SIGKILL);
      break;
    case StepFault::hang:
      say(fmt::format("rank {} hangs at the start of step {} (sleeps until the job is ended)",
                      rank_, step));
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    case StepFault::none:
      break;
  }
}

void FaultInjector::at_phase_start(Phase phase) {
  const double s = phase_delay_s(phase);
  if (s <= 0.0) return;
  if (!slow_said_) {
    say(fmt::format("rank {} sleeps {} s at the start of every {} call", rank_, s,
                    to_string(phase)));
    slow_said_ = true;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

void FaultInjector::after_grad_reduction(std::int64_t step, std::span<float> grad) const {
  const std::optional<float> value = nonfinite_grad(step);
  if (!value) return;
  if (grad.empty()) {
    say(fmt::format("rank {} holds no gradient element at step {}; nothing injected", rank_, step));
    return;
  }
  grad[0] = *value;
  say(
      fmt::format("rank {} wrote {} into its first gradient element at step {} (after the "
                  "reductions, before the checks)",
                  rank_, *value, step));
}

}  // namespace meshtrain
