// src/meshtrain/optim/adamw.h — AdamW over optimizer shards (a whole parameter each, or the
// slice a ZeRO rank owns), fp32 moments (MemCategory::optimizer), with the global grad-norm
// clipping and the LR schedule it uses.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/core/tensor.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/parameter.h"
#include "meshtrain/layers/placement.h"

namespace meshtrain {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied to Parameter::weight_decay parameters only
};

class AdamW {
 public:
  /// Allocates m and v (zeros, f32 [end − begin] each) for every shard; steps master with
  /// grad. The shards' tensors must outlive the optimizer.
  AdamW(OptimizerShards shards, const AdamWConfig& config);
  /// Whole fp32 parameters (whole_shards): steps p.value with p.grad.
  AdamW(const ParameterList& params, const AdamWConfig& config);
  /// One step at learning rate `lr` on every shard (kernels::adamw_step_all), with the gradients
  /// multiplied by `grad_scale` inside the update (clip_coefficient: clipping folded into the
  /// pass over the parameters). The shards' gradients are not written, unless `zero_grads`:
  /// then each is set to +0 as the update reads it (the next step's zero_grad for the shards'
  /// elements, without a pass of its own; ZeroSharding::zero_grad clears the rest).
  void step(double lr, float grad_scale = 1.0f, bool zero_grads = false);
  std::int64_t steps_taken() const noexcept { return step_; }
  /// The moments of shard i (f32 [end − begin]): for checkpoints, which save and restore them
  /// with steps_taken (the bias correction's t).
  Tensor& exp_avg(std::size_t i) { return m_.at(i); }
  Tensor& exp_avg_sq(std::size_t i) { return v_.at(i); }
  void set_steps_taken(std::int64_t steps) noexcept { step_ = steps; }

 private:
  OptimizerShards shards_;
  AdamWConfig config_;
  std::vector<Tensor> m_, v_;
  std::vector<kernels::AdamWTensor> step_tensors_;  // step()'s list, kept: no allocation per step
  std::int64_t step_ = 0;
};

/// √(Σ over every logical parameter of Σ grad²), accumulated in double, counting each logical
/// element once (Megatron-LM's rule, Shoeybi et al. 2019, generalised to any placement): each
/// rank adds the squares of the shards whose copy counts (ParamPlacement::counts_copy,
/// mesh/placement.h), then all-reduces over dp × cp, tp and pp — together the world —
/// add them up, so every rank gets the same number (the dp × cp one is skipped when every
/// replica holds the same gradients: no ZeRO and no experts). Padding is zero and adds nothing.
/// Gradients must already be reduced over their replica groups. Under ZeRO (the placements'
/// zero_stage ≥ 1) the shards are slices, each replica holding a disjoint part.
double global_grad_norm(const OptimizerShards& shards, const PlacementGroups& groups);
/// The same for whole parameters of one process (no sharding, no replicas).
double global_grad_norm(const ParameterList& params);

/// Scales every gradient by max_norm / norm when norm > max_norm (torch.nn.utils.
/// clip_grad_norm_, which adds 1e-6 to the norm); max_norm ≤ 0 disables clipping.
void clip_grads(const ParameterList& params, double norm, double max_norm);
void clip_grads(const OptimizerShards& shards, double norm, double max_norm);
/// The factor clip_grads multiplies by (f32, as it rounds it), or 1 when it would not clip.
float clip_coefficient(double norm, double max_norm);

/// Linear warmup then cosine decay to min_lr, as nanoGPT's get_lr (train.py):
/// step < warmup: peak·(step+1)/(warmup+1); step > decay_steps: min_lr; otherwise
/// min_lr + ½(1 + cos(π·(step − warmup)/(decay_steps − warmup)))·(peak − min_lr). step is
/// 0-based.
double lr_at(std::int64_t step, double peak, double min_lr, std::int64_t warmup,
             std::int64_t decay_steps);

}  // namespace meshtrain
