#include "meshtrain/train/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace meshtrain {

void EtaEstimator::add(const StepMetrics& m, double wall_s) {
  step_ = m.step;
  const double eval_s = m.val_loss ? std::max(0.0, wall_s - m.step_time_s - m.checkpoint_s) : 0.0;
  recent_.push_back(wall_s - eval_s);
  if (recent_.size() > kWindow) recent_.pop_front();
  if (m.val_loss) {
    eval_s_ += eval_s;
    ++evals_;
  }
}

std::int64_t EtaEstimator::evaluations_after(std::int64_t step) const {
  if (step >= max_steps_) return 0;
  // Trainer::run evaluates every eval_interval-th step and always the last one.
  std::int64_t n = 0;
  if (eval_interval_ > 0) n = max_steps_ / eval_interval_ - step / eval_interval_;
  if (eval_interval_ <= 0 || max_steps_ % eval_interval_ != 0) ++n;
  return n;
}

double EtaEstimator::eta_s() const {
  if (recent_.empty()) return 0.0;
  const double per_step =
      std::accumulate(recent_.begin(), recent_.end(), 0.0) / static_cast<double>(recent_.size());
  const double per_eval = evals_ > 0 ? eval_s_ / static_cast<double>(evals_) : 0.0;
  return per_step * static_cast<double>(std::max<std::int64_t>(0, max_steps_ - step_)) +
         per_eval * static_cast<double>(evaluations_after(step_));
}

std::string format_duration(double seconds) {
  const auto s = static_cast<std::int64_t>(std::llround(std::max(0.0, seconds)));
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

void RunSummary::add(const StepMetrics& m, std::int64_t tokens_per_step, double elapsed_s) {
  if (steps == 0) first_step = m.step;
  ++steps;
  last_step = m.step;
  tokens += tokens_per_step;
  step_time_s += m.step_time_s;
  mfu_time_s += m.mfu * m.step_time_s;
  wall_s = elapsed_s;
  if (m.val_loss && (!best_val_loss || *m.val_loss < *best_val_loss)) {
    best_val_loss = m.val_loss;
    best_val_step = m.step;
  }
}

double RunSummary::tokens_per_s() const {
  return step_time_s > 0.0 ? static_cast<double>(tokens) / step_time_s : 0.0;
}

double RunSummary::mfu() const { return step_time_s > 0.0 ? mfu_time_s / step_time_s : 0.0; }

std::string RunSummary::format() const {
  const double wall_tokens_per_s = wall_s > 0.0 ? static_cast<double>(tokens) / wall_s : 0.0;
  return fmt::format(
      "summary: {} steps ({}–{}) | {} tokens | wall {} ({:.3f} s) | {:.1f} tokens/s ({:.1f} over "
      "the wall time) | MFU {:.3f}% | {} | peak memory {:.1f} MiB ({} bytes, rank {})",
      steps, first_step, last_step, tokens, format_duration(wall_s), wall_s, tokens_per_s(),
      wall_tokens_per_s, mfu() * 100.0,
      best_val_loss ? fmt::format("best val_loss {:.6f} at step {}", *best_val_loss, best_val_step)
                    : std::string("no val_loss"),
      static_cast<double>(peak_bytes) / 1048576.0, peak_bytes, peak_rank);
}

}  // namespace meshtrain
