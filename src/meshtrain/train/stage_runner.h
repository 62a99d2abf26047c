// src/meshtrain/train/stage_runner.h — the trainer's side of the pipeline executor: runs the
// forward and backward of one (micro-batch, chunk) of this rank's PipelineStage, reading the
// micro-batch's tokens and targets from the global-batch sampler (first and last chunk only),
// summing the micro-batch losses on the last stage, and deferring weight gradients to W for
// zero-bubble schedules (layers/weight_grad_queue.h). EvalRunner is evaluation's side: the
// forwards of a Pass::eval schedule over the val sampler, each freeing its activations.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "meshtrain/data/sampler.h"
#include "meshtrain/layers/weight_grad_queue.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/pp/executor.h"
#include "meshtrain/train/fault_injector.h"
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
  // (parallel/cp/context_parallel.h).
  int cp_rank = 0, cp_size = 1;
  std::int64_t local_len() const { return seq_len / cp_size; }
};

/// This rank's micro-batches of one global batch, each read from the sampler once, when its
/// first or last chunk asks for it.
class MicroBatchReader {
 public:
  MicroBatchReader(const data::GlobalBatchSampler& sampler, const MicroBatching& batching)
      : sampler_(sampler), batching_(batching) {}
  /// Reads global batch `step` from now on.
  void begin(std::int64_t step);
  /// Reads micro-batch `microbatch` of the batch unless it was read already.
  void fill(int microbatch);
  /// [micro_batch, seq_len] i32 tokens and targets (the tokens shifted left by one).
  const std::vector<std::int32_t>& tokens(int microbatch);
  const std::vector<std::int32_t>& targets(int microbatch);

 private:
  const data::GlobalBatchSampler& sampler_;
  MicroBatching batching_;
  std::int64_t step_ = 0;
  std::map<int, std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>>> data_;
};

/// [tokens, C] between chunks, [tokens/tp, C] under sequence parallelism (f32).
Shape boundary_shape_of(PipelineStage& stage, const MicroBatching& batching);

class StageRunner final : public pp::StageRunner {
 public:
  StageRunner(PipelineStage& stage, const data::GlobalBatchSampler& sampler,
              const MicroBatching& batching);

  /// Reads global batch `step` from now on and clears the loss sum.
  void begin_step(std::int64_t step);
  /// Σ of the micro-batch losses computed here (non-zero on the last stage only).
  double loss_sum() const { return loss_sum_; }
  /// The factor backward multiplies the loss by (the fp16 loss scale; 1 otherwise).
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  /// Times data, forward and backward with `clock` into phases() from now on.
  void set_clock(PhaseClock clock) { clock_ = std::move(clock); }
  PhaseSeconds& phases() { return phases_; }
  /// Calls `faults`' at_phase_start at the start of every forward and backward call from now
  /// on (a slow rank sleeps there; train/fault_injector.h). Not owned.
  void set_faults(FaultInjector* faults) { faults_ = faults; }

  Tensor forward(int microbatch, int chunk, int slot, const Tensor& input) override;
  Tensor backward(int microbatch, int chunk, int slot, const Tensor& grad_output,
                  bool weight_grads) override;
  void backward_weight(int microbatch, int chunk, int slot) override;
  Shape boundary_shape() const override;

 private:
  Tensor backward_untimed(int chunk, int slot, const Tensor& grad_output, bool weight_grads);

  PipelineStage& stage_;
  MicroBatching batching_;
  MicroBatchReader reader_;
  WeightGradQueue weight_grads_;
  double loss_sum_ = 0.0;
  float loss_scale_ = 1.0f;
  PhaseClock clock_;
  PhaseSeconds phases_;
  FaultInjector* faults_ = nullptr;
  void inject_faults(Phase phase);
};

/// Evaluation through the executor (a Pass::eval schedule): F of (micro-batch, chunk) runs the
/// chunk's forward on the val micro-batch, adds the loss on the model's last chunk, and frees
/// the chunk's activations at once (no backward follows). Has no backward.
class EvalRunner final : public pp::StageRunner {
 public:
  EvalRunner(PipelineStage& stage, const data::GlobalBatchSampler& sampler,
             const MicroBatching& batching);

  /// Reads global batch `batch` from now on; the loss sum goes on.
  void begin_batch(std::int64_t batch) { reader_.begin(batch); }
  /// Σ of the micro-batch losses computed here since the last call (non-zero on the last
  /// stage only), in the order they were computed; clears it.
  double take_loss_sum() { return std::exchange(loss_sum_, 0.0); }

  Tensor forward(int microbatch, int chunk, int slot, const Tensor& input) override;
  Tensor backward(int microbatch, int chunk, int slot, const Tensor& grad_output,
                  bool weight_grads) override;
  void backward_weight(int microbatch, int chunk, int slot) override;
  Shape boundary_shape() const override;

 private:
  PipelineStage& stage_;
  MicroBatching batching_;
  MicroBatchReader reader_;
  double loss_sum_ = 0.0;
};

}  // namespace meshtrain
