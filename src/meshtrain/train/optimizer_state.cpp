#include "meshtrain/train/optimizer_state.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "meshtrain/config/validate.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/parallel/pp/tied_embeddings.h"

namespace meshtrain {
namespace {

DType compute_dtype(const TrainingConfig& t) {
  switch (t.precision) {
    case Precision::bf16:
      return DType::bf16;
    case Precision::fp16:
      return DType::f16;
    case Precision::fp32:
      break;
  }
  return DType::f32;
}

ZeroOptions zero_options(const Config& config, HfImport* import, NonFiniteGradWatch* watch) {
  ZeroOptions options{.stage = static_cast<int>(config.parallel.zero_stage),
                      .compute_dtype = compute_dtype(config.training),
                      .bucket_bytes = config.parallel.bucket_mib << 20,
                      .overlap_grad_reduce = overlap_grad_reduce(config.parallel),
                      .microbatches = static_cast<int>(config.training.accumulation),
                      .seed = static_cast<std::uint64_t>(config.training.seed),
                      .initial_values = {},
                      .non_finite_watch = watch};
  if (import != nullptr) {
    options.initial_values = [import](const Parameter& p, std::int64_t begin, std::int64_t end,
                                      float* out) { import->fill(p, begin, end, out); };
  }
  return options;
}

}  // namespace

OptimizerState::OptimizerState(const Config& config, const DeviceMesh& mesh, PipelineStage& stage,
                               HfImport* import)
    : config_(config), mesh_(mesh) {
  const TrainingConfig& t = config.training;
  zero_ = std::make_unique<ZeroSharding>(
      stage.parameters(), stage.units(),
      [&mesh](ReplicaGroup g) {
        return ReductionGroup{replica_group(mesh, g), grad_reduction_group(mesh).size()};
      },
      zero_options(config, import, watch()));
  stage.set_hooks(zero_.get());
  if (t.precision == Precision::fp16) {
    scaler_ = std::make_unique<DynamicLossScaler>(
        LossScalerConfig{.initial_scale = t.loss_scale_init,
                         .growth_interval = t.loss_scale_growth_interval,
                         .growth = t.loss_scale_growth,
                         .backoff = t.loss_scale_backoff,
                         .hysteresis = t.loss_scale_hysteresis});
  }
  replicated_grads_ = std::make_unique<ReplicatedGradSum>(
      zero_->shards(), mesh.group(Axis::tp), watch());
  optimizer_ = std::make_unique<AdamW>(
      zero_->shards(),
      AdamWConfig{
          .beta1 = t.beta1, .beta2 = t.beta2, .eps = t.eps, .weight_decay = t.weight_decay});
}

NonFiniteGradWatch* OptimizerState::watch() {
  return config_.training.check_for_nan_in_grad ? &grad_watch_ : nullptr;
}

void OptimizerState::reduce_gradients(const ParameterList& tied, ProcessGroup* tied_group) {
  const auto start = std::chrono::steady_clock::now();
  zero_->reduce_gradients();
  // After backward, plus what the hooks spent on the reduction during it (stages 1–3 post and
  // wait there; stage 2–3 without overlap reduce there entirely).
  dp_exposed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() +
                  zero_->reduce_seconds_in_backward();
  sum_tied_embeddings(tied, tied_group, zero_->shards(), watch());
  replicated_grads_->all_reduce();  // sequence parallel: partial sums over tp, once per step
}

const Parameter* OptimizerState::first_non_finite_grad() const {
  for (const OptimizerShard& s : zero_->shards()) {
    const auto g = s.grad.span_f32();
    if (std::any_of(g.begin(), g.end(), [](float x) { return !std::isfinite(x); })) {
      return s.param;
    }
  }
  return nullptr;
}

bool OptimizerState::unscale_or_skip(ProcessGroup& world) {
  if (!scaler_) return false;
  // Every rank must skip the same step: the flag is the MAX over the whole world (seed 000,
  // §3.3), not over one group.
  std::int32_t found = first_non_finite_grad() != nullptr ? 1 : 0;
  world.all_reduce_max(std::span<std::int32_t>(&found, 1));
  const float scale = static_cast<float>(scaler_->scale());
  skipped_ = scaler_->update(found > 0);
  if (skipped_) return true;
  for (OptimizerShard& s : zero_->shards()) {
    kernels::scale_inplace(s.grad.f32(), 1.0f / scale, s.grad.numel());
  }
  return false;
}

double OptimizerState::grad_norm() {
  return global_grad_norm(zero_->shards(), placement_groups(mesh_));
}

double OptimizerState::apply_update(std::int64_t step, double grad_norm) {
  const TrainingConfig& t = config_.training;
  const std::int64_t decay_steps = t.lr_decay_steps > 0 ? t.lr_decay_steps : t.max_steps;
  const double lr = lr_at(step, scaled_peak_lr(config_), t.min_lr, t.warmup_steps, decay_steps);
  const bool stepped = !skipped_;
  if (stepped) {
    // Clipping folded into the update (one pass over the gradients fewer; bitwise the same
    // as clip_grads then step, fused_kernels_test), and the shards' gradients zeroed as it
    // reads them (one memset pass fewer).
    optimizer_->step(lr, clip_coefficient(grad_norm, t.grad_clip), /*zero_grads=*/true);
    zero_->publish_parameters();
  }
  skipped_ = false;
  zero_->zero_grad(/*shards_zeroed=*/stepped);
  grad_watch_.clear();  // the note was about the gradients just zeroed
  return lr;
}

}  // namespace meshtrain
