// src/meshtrain/optim/loss_scaler.h
//
// Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, "Mixed Precision
// Training", §3.2): the loss is multiplied by `scale` before backward so that small gradients
// survive fp16's narrow range, and the gradients are divided by it before the optimizer. When
// a gradient overflows (inf or NaN on ANY rank — the caller combines the flag with a MAX over
// the whole world, so every rank takes the same decision) the step is skipped; after
// `hysteresis` overflowing steps the scale is multiplied by `backoff`; after `growth_interval`
// clean steps in a row it is multiplied by `growth`. The hysteresis counter follows Megatron-LM's
// DynamicGradScaler (it is refilled when the scale grows). Pure arithmetic: no communication.
#pragma once

#include <cstdint>

namespace meshtrain {

struct LossScalerConfig {
  double initial_scale = 65536.0;
  std::int64_t growth_interval = 1000;  // clean steps in a row before the scale grows
  double growth = 2.0;                  // > 1
  double backoff = 0.5;                 // in (0, 1)
  std::int64_t hysteresis = 2;          // overflowing steps before the scale backs off, ≥ 1
  // The scale never grows beyond this: 2^24 · 2^-24 (fp16's smallest subnormal) is 1, so a
  // larger scale only overflows more often, and a runaway growth would take hundreds of
  // skipped steps to back off from.
  double max_scale = 16777216.0;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScalerConfig& config);

  /// The factor the loss is multiplied by for this step.
  double scale() const noexcept { return scale_; }
  /// Records the step's outcome (`found_inf` must be the same on every rank) and returns true
  /// when the step must be skipped (found_inf). Updates the scale as described above; the
  /// scale stays in [1, max_scale] (a scale under 1 would only lose precision).
  bool update(bool found_inf);
  std::int64_t skipped_steps() const noexcept { return skipped_; }

  /// Everything update() depends on, for checkpoints (restored bit for bit on resume).
  struct State {
    double scale;
    std::int64_t clean_steps;
    std::int64_t hysteresis_left;
    std::int64_t skipped;
  };
  State state() const noexcept { return {scale_, clean_steps_, hysteresis_left_, skipped_}; }
  void restore(const State& s) noexcept {
    scale_ = s.scale;
    clean_steps_ = s.clean_steps;
    hysteresis_left_ = s.hysteresis_left;
    skipped_ = s.skipped;
  }

 private:
  LossScalerConfig config_;
  double scale_;
  std::int64_t clean_steps_ = 0;
  std::int64_t hysteresis_left_;
  std::int64_t skipped_ = 0;
};

}  // namespace meshtrain
