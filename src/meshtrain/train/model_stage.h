// src/meshtrain/train/model_stage.h
//
// This rank's side of the model: its pipeline stage (the chunks of the model it holds, its tp
// shards), the schedule's executor over the pp group, the StageRunner that feeds the
// executor's actions with micro-batches of the training sampler, and, for gpt2 over several
// stages, the group of the first and last stage that sum the tied embedding's gradients. It
// runs one step's schedule and measures its bubble, and evaluation through a forward-only
// schedule of the same executor.
// Uses: model/, parallel/pp, comm/, data/. Knows nothing of optimizers or output files.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/config/config.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/pp/executor.h"
#include "meshtrain/train/stage_runner.h"

namespace meshtrain {

class ModelStage {
 public:
  /// Builds the chunks of this rank's pp coordinate WITHOUT parameter storage (ZeroSharding
  /// gives each rank what it keeps, so no memory category peaks above its steady state), the
  /// executor of parallel.pp_schedule over training.accumulation micro-batches with its runner
  /// over `train`, and the forward-only executor of evaluation with its runner over `val`.
  /// Collective over pp and ep (the tied group's split, the parameter count).
  ModelStage(const Config& config, const DeviceMesh& mesh, const data::GlobalBatchSampler& train,
             const data::GlobalBatchSampler& val);
  ModelStage(const ModelStage&) = delete;
  ModelStage& operator=(const ModelStage&) = delete;

  PipelineStage& stage() { return *stage_; }
  const PipelineStage& stage() const { return *stage_; }
  const pp::PipelineExecutor& executor() const { return *executor_; }
  StageRunner& runner() { return *runner_; }
  /// pp ranks 0 and pp − 1 (gpt2, pp > 1: the tied embedding's two copies); nullptr otherwise.
  ProcessGroup* tied_group() const { return tied_group_.get(); }
  /// Parameters of the whole logical model (every stage, no padding, tied weights once).
  std::int64_t logical_parameters() const noexcept { return logical_parameters_; }
  /// The schedule's bubble fraction with unit costs (pp::simulate).
  double predicted_bubble() const noexcept { return predicted_bubble_; }
  /// The last run_step's measured bubble, averaged over the pp ranks (0 when pp = 1).
  double last_bubble() const noexcept { return last_bubble_; }

  /// Forward and backward of every micro-batch of global batch `step` as the schedule orders
  /// them, backward multiplying the loss by `loss_scale`; returns this rank's actions, timed.
  /// Collective over pp.
  std::vector<pp::ExecutedAction> run_step(std::int64_t step, float loss_scale);
  /// Σ of the val losses of this rank's micro-batches of val global batches [0, batches),
  /// added in (batch, micro-batch) order (non-zero on the last stage only): per batch one run
  /// of the Pass::eval schedule (parallel/pp/schedule.h). Collective over pp.
  double evaluate_sum(std::int64_t batches);

 private:
  void measure_bubble(const std::vector<pp::ExecutedAction>& actions);

  const Config& config_;
  const DeviceMesh& mesh_;
  MicroBatching batching_;
  std::unique_ptr<PipelineStage> stage_;
  std::unique_ptr<pp::PipelineExecutor> executor_;
  std::unique_ptr<StageRunner> runner_;
  std::unique_ptr<pp::PipelineExecutor> eval_executor_;
  std::unique_ptr<EvalRunner> eval_runner_;
  std::unique_ptr<ProcessGroup> tied_group_;
  std::int64_t logical_parameters_ = 0;
  double predicted_bubble_ = 0.0;
  double last_bubble_ = 0.0;
};

}  // namespace meshtrain
