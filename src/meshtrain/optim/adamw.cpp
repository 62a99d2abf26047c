#include "meshtrain/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

AdamW::AdamW(OptimizerShards shards, const AdamWConfig& config)
    : shards_(std::move(shards)), config_(config) {
  for (const OptimizerShard& s : shards_) {
    m_.push_back(Tensor::zeros({s.end - s.begin}, MemCategory::optimizer));
    v_.push_back(Tensor::zeros({s.end - s.begin}, MemCategory::optimizer));
  }
}

AdamW::AdamW(const ParameterList& params, const AdamWConfig& config)
    : AdamW(whole_shards(params), config) {}

void AdamW::step(double lr, float grad_scale, bool zero_grads) {
  ++step_;
  std::vector<kernels::AdamWTensor>& tensors = step_tensors_;  // keeps its capacity
  tensors.clear();
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    const OptimizerShard& s = shards_[i];
    if (s.end == s.begin) continue;
    const Parameter& p = *s.param;
    Tensor master = s.master;  // handles: the update writes through to the shard's storage
    Tensor grad = s.grad;
    tensors.push_back(
        {master.span_f32(), m_[i].span_f32(), v_[i].span_f32(), grad.span_f32(),
         kernels::AdamWParams{
             .lr = static_cast<float>(lr),
             .beta1 = static_cast<float>(config_.beta1),
             .beta2 = static_cast<float>(config_.beta2),
             .eps = static_cast<float>(config_.eps),
             .weight_decay = p.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f,
             .grad_scale = grad_scale,
         },
         zero_grads ? grad.span_f32() : std::span<float>()});
  }
  kernels::adamw_step_all(tensors, step_);
}

double global_grad_norm(const ParameterList& params) {
  double sum = 0.0;
  for (const Parameter* p : params) {
    if (!p->placement.tied_copy) sum += kernels::sum_squares(p->grad.f32(), p->grad.numel());
  }
  return std::sqrt(sum);
}

double global_grad_norm(const OptimizerShards& shards, const PlacementGroups& groups) {
  // Without ZeRO and without experts every dp × cp replica holds the same gradients, so each
  // counts them as replica 0 would and the all-reduce over dp × cp is skipped (it would add
  // zeros): the step's dp traffic stays exactly the gradient reduction.
  const bool replicas_differ =
      std::any_of(shards.begin(), shards.end(), [](const OptimizerShard& s) {
        return s.param->placement.zero_stage >= 1 ||
               s.param->placement.replicas == ReplicaGroup::expert;
      });
  PlacementRanks ranks = groups.ranks();
  if (!replicas_differ) ranks.dense = ranks.expert = 0;
  double sum = 0.0;
  for (const OptimizerShard& s : shards) {
    if (s.param->placement.counts_copy(ranks)) {
      sum += kernels::sum_squares(s.grad.f32(), s.grad.numel());
    }
  }
  if (replicas_differ) groups.dense.all_reduce_sum(std::span<double>(&sum, 1));
  groups.tp.all_reduce_sum(std::span<double>(&sum, 1));
  groups.pp.all_reduce_sum(std::span<double>(&sum, 1));
  return std::sqrt(sum);
}

void clip_grads(const ParameterList& params, double norm, double max_norm) {
  clip_grads(whole_shards(params), norm, max_norm);
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef >= 1.0 ? 1.0f : static_cast<float>(coef);
}

void clip_grads(const OptimizerShards& shards, double norm, double max_norm) {
  const float coef = clip_coefficient(norm, max_norm);
  if (coef == 1.0f) return;
  for (const OptimizerShard& s : shards) {
    Tensor grad = s.grad;
    kernels::scale_inplace(grad.f32(), coef, grad.numel());
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
