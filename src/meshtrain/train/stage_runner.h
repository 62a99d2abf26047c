// src/meshtrain/train/stage_runner.h — the trainer's side of the pipeline executor: runs the
// forward and backward of one (micro-batch, chunk) of this rank's PipelineStage, reading the
// micro-batch's tokens and targets from the global-batch sampler (first and last chunk only),
// summing the micro-batch losses on the last stage, and deferring weight gradients to W for
// zero-bubble schedules (layers/weight_grad_queue.h).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "meshtrain/data/sampler.h"
#include "meshtrain/layers/weight_grad_queue.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/pp/executor.h"
#include "meshtrain/train/straggler.h"

namespace meshtrain {

struct MicroBatching {
  std::int64_t micro_batch;   // sequences per micro-batch
  std::int64_t seq_len;       // tokens per sequence (block_size, the whole sequence)
  std::int64_t microbatches;  // per step (training.accumulation)
  int dp_rank, dp_size;
  int tp_size;
  bool sequence_parallel;
  // Context parallel: this rank keeps its zigzag share, seq_len/cp rows of every sequence
  // (layers/parallel_groups.h).
  int cp_rank = 0, cp_size = 1;
  std::int64_t local_len() const { return seq_len / cp_size; }
};

/// Rows of `full` ([sequences, seq_len] tokens) that cp rank `cp_rank` of `cp_size` holds, in
/// its local order: per sequence chunk cp_rank, then chunk 2·cp_size−1−cp_rank.
std::vector<std::int32_t> zigzag_rows(const std::vector<std::int32_t>& full, std::int64_t sequences,
                                      std::int64_t seq_len, int cp_rank, int cp_size);

class StageRunner final : public pp::StageRunner {
 public:
  StageRunner(PipelineStage& stage, const data::GlobalBatchSampler& sampler,
              const MicroBatching& batching, const pp::PipelineExecutor& executor);

  /// Reads global batch `step` from now on and clears the loss sum.
  void begin_step(std::int64_t step);
  /// Σ of the micro-batch losses computed here (non-zero on the last stage only).
  double loss_sum() const { return loss_sum_; }
  /// The factor backward multiplies the loss by (the fp16 loss scale; 1 otherwise).
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  /// Times data, forward and backward with `clock` into phases() from now on.
  void set_clock(PhaseClock clock) { clock_ = std::move(clock); }
  PhaseSeconds& phases() { return phases_; }
  /// Test hook: sleeps `seconds` at the start of every forward or backward call (phase).
  void set_delay(Phase phase, double seconds) { delay_[static_cast<std::size_t>(phase)] = seconds; }

  Tensor forward(int microbatch, int chunk, const Tensor& input) override;
  Tensor backward(int microbatch, int chunk, const Tensor& grad_output, bool weight_grads) override;
  void backward_weight(int microbatch, int chunk) override;
  Shape boundary_shape() const override;

 private:
  const std::vector<std::int32_t>& tokens(int microbatch);
  const std::vector<std::int32_t>& targets(int microbatch);
  void fill(int microbatch);
  Tensor backward_untimed(int chunk, const Tensor& grad_output, bool weight_grads);

  PipelineStage& stage_;
  const data::GlobalBatchSampler& sampler_;
  MicroBatching batching_;
  const pp::PipelineExecutor& executor_;
  WeightGradQueue weight_grads_;
  std::int64_t step_ = 0;
  double loss_sum_ = 0.0;
  float loss_scale_ = 1.0f;
  PhaseClock clock_;
  PhaseSeconds phases_;
  std::array<double, kNumPhases> delay_{};
  void delay(Phase phase) const;
  std::map<int, std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>>> data_;
};

}  // namespace meshtrain
