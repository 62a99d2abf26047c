// src/meshtrain/train/optimizer_state.h
//
// Everything that turns the stage's gradients into a parameter update: where parameters,
// fp32 master slices and gradients live (ZeroSharding, parallel.zero_stage), the reduction of
// the gradients over the data-parallel ranks, the gpt2 tied embedding's sum over stages, the tp
// sum of replicated gradients under sequence parallelism, the fp16 loss scaler, the global
// grad norm, clipping and AdamW at the schedule's LR.
// Uses: parallel/dp, parallel/tp, parallel/pp (the tied embedding's sum), optim/, comm/.
// Knows nothing of schedules or data.
#pragma once

#include <cstdint>
#include <memory>

#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/config/config.h"
#include "meshtrain/layers/non_finite_grads.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/parallel/dp/zero.h"
#include "meshtrain/parallel/tp/replicated_grads.h"

namespace meshtrain {

class OptimizerState {
 public:
  /// Initialises what this rank keeps of `stage`'s deferred parameters (from `import` when
  /// given, else from training.seed), installs the ZeRO hooks in the stage, and builds the
  /// scaler (fp16) and AdamW over this rank's master slices. Collective over the
  /// grad_reduction_group.
  OptimizerState(const Config& config, const DeviceMesh& mesh, PipelineStage& stage,
                 HfImport* import);
  OptimizerState(const OptimizerState&) = delete;
  OptimizerState& operator=(const OptimizerState&) = delete;

  ZeroSharding& zero() { return *zero_; }
  OptimizerShards& shards() { return zero_->shards(); }
  AdamW& adamw() { return *optimizer_; }
  /// fp16 only; nullptr otherwise.
  DynamicLossScaler* loss_scaler() { return scaler_.get(); }
  const DynamicLossScaler* loss_scaler() const { return scaler_.get(); }
  /// The factor the next backward multiplies the loss by: the fp16 scale, 1 otherwise.
  float loss_scale() const { return scaler_ ? static_cast<float>(scaler_->scale()) : 1.0f; }

  /// After the step's backward passes: the reduction over the grad_reduction_group (ZeRO
  /// stages 2, 3: done during backward), the sum of the tied embedding's copies (`tied`, the
  /// stage's; `tied_group` between the first and last stage, or nullptr), and the tp sum of
  /// the replicated parameters' partial gradients (sequence parallel).
  void reduce_gradients(const ParameterList& tied, ProcessGroup* tied_group);
  /// Seconds of the last step's dp (ZeRO) gradient reduction that did not overlap compute:
  /// what reduce_gradients() spent (posting the buckets not posted during backward and
  /// waiting for all) plus what the parameter hooks spent on it during backward (posting,
  /// testing, waiting for a free reduce-scatter slot; at stages 2–3 without overlap, the whole
  /// reduce-scatters). Stage 3's parameter gathers are not included. The metrics'
  /// dp_comm_exposed_s.
  double dp_exposed_seconds() const noexcept { return dp_exposed_s_; }
  /// fp16: whether some rank of `world` holds a non-finite gradient (the same verdict on every
  /// rank); updates the scale and, unless the step is skipped, unscales the gradients.
  /// Returns true when the step is skipped. Without a scaler: false, nothing changes.
  bool unscale_or_skip(ProcessGroup& world);
  /// The global grad norm of the shards (every rank the same).
  double grad_norm();
  /// The parameter of this rank's first non-finite gradient element; nullptr when none.
  const Parameter* first_non_finite_grad() const;
  /// This step's first non-finite gradient element this rank put into a reduction (before it
  /// spread: the dp or expert-dp reduction, the tied embedding's sum, the sequence-parallel
  /// sum); empty when there was none, or training.check_for_nan_in_grad is off.
  const std::optional<NonFiniteGrad>& first_non_finite_before_reduction() const noexcept {
    return grad_watch_.first();
  }
  /// training.check_for_nan_in_grad: whether the reductions check what they are given.
  bool checks_before_reduction() const noexcept { return config_.training.check_for_nan_in_grad; }
  /// Clips with `grad_norm`, applies AdamW at the LR of step `step` (0-based), publishes the
  /// parameters (ZeRO), zeroes the gradients; returns the LR. After a skipped step only
  /// zeroes the gradients.
  double apply_update(std::int64_t step, double grad_norm);

 private:
  /// &grad_watch_ when training.check_for_nan_in_grad, else null.
  NonFiniteGradWatch* watch();

  const Config& config_;
  const DeviceMesh& mesh_;
  NonFiniteGradWatch grad_watch_;  // reached through watch() by every gradient reduction
  std::unique_ptr<ZeroSharding> zero_;
  std::unique_ptr<ReplicatedGradSum> replicated_grads_;
  std::unique_ptr<DynamicLossScaler> scaler_;
  std::unique_ptr<AdamW> optimizer_;
  bool skipped_ = false;  // the last unscale_or_skip skipped its step
  double dp_exposed_s_ = 0.0;
};

}  // namespace meshtrain
