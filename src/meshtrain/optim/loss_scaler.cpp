#include "meshtrain/optim/loss_scaler.h"

#include <algorithm>

namespace meshtrain {

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& config)
    : config_(config), scale_(config.initial_scale), hysteresis_left_(config.hysteresis) {}

bool DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    ++skipped_;
    clean_steps_ = 0;
    // Not refilled here: once the hysteresis is used up, every further overflow backs off
    // until a growth refills it (Megatron-LM).
    if (--hysteresis_left_ <= 0) scale_ = std::max(1.0, scale_ * config_.backoff);
    return true;
  }
  if (++clean_steps_ == config_.growth_interval) {
    clean_steps_ = 0;
    hysteresis_left_ = config_.hysteresis;
    scale_ = std::min(config_.max_scale, scale_ * config_.growth);
  }
  return false;
}

}  // namespace meshtrain
