#include "meshtrain/optim/adamw.h"

#include <cmath>
#include <numbers>

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

AdamW::AdamW(const ParameterList& params, const AdamWConfig& config)
    : params_(params), config_(config) {
  for (const Parameter* p : params_) {
    m_.push_back(Tensor::zeros(p->value.shape(), MemCategory::optimizer));
    v_.push_back(Tensor::zeros(p->value.shape(), MemCategory::optimizer));
  }
}

void AdamW::step(double lr) {
  ++step_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const kernels::AdamWParams hp{
        .lr = static_cast<float>(lr),
        .beta1 = static_cast<float>(config_.beta1),
        .beta2 = static_cast<float>(config_.beta2),
        .eps = static_cast<float>(config_.eps),
        .weight_decay = p.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f,
    };
    kernels::adamw_step(p.value.span_f32(), m_[i].span_f32(), v_[i].span_f32(), p.grad.span_f32(),
                        hp, step_);
  }
}

double global_grad_norm(const ParameterList& params, ProcessGroup& tp, ProcessGroup& pp) {
  double sum = 0.0;
  for (const Parameter* p : params) {
    if (!p->tied_copy && (p->is_sharded() || tp.rank() == 0)) {
      sum += kernels::sum_squares(p->grad.f32(), p->grad.numel());
    }
  }
  tp.all_reduce_sum(std::span<double>(&sum, 1));
  pp.all_reduce_sum(std::span<double>(&sum, 1));
  return std::sqrt(sum);
}

void clip_grads(const ParameterList& params, double norm, double max_norm) {
  if (max_norm <= 0.0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  for (Parameter* p : params) {
    kernels::scale_inplace(p->grad.f32(), static_cast<float>(coef), p->grad.numel());
  }
}

double lr_at(std::int64_t step, double peak, double min_lr, std::int64_t warmup,
             std::int64_t decay_steps) {
  if (step < warmup) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup + 1);
  }
  if (step > decay_steps) return min_lr;
  if (decay_steps == warmup) return min_lr;
  const double ratio =
      static_cast<double>(step - warmup) / static_cast<double>(decay_steps - warmup);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return min_lr + coeff * (peak - min_lr);
}

}  // namespace meshtrain
