// src/meshtrain/parallel/pp/executor.h
//
// The one executor of every pipeline schedule (DESIGN invariant 6): it walks this rank's
// action list (schedule_for) and calls the model through StageRunner. Activations and
// gradients cross stages with non-blocking point-to-point messages: each receive is posted
// while the compute action before the one that needs it runs (so a transfer overlaps compute);
// sends are posted without waiting (their buffers are freed as they complete, the rest waited
// for at the end of the step), so two stages that both send first never block each other. Every
// compute action names the activation slot of its (micro-batch, chunk), slot_of, so the layers
// keep each in-flight micro-batch's activations apart. What it knows: ProcessGroup, Tensor, the
// schedule. What it does not: models, optimizers.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/core/tensor.h"
#include "meshtrain/parallel/pp/schedule.h"

namespace meshtrain::pp {

/// This rank's model chunks, driven one (micro-batch, chunk) at a time; implemented by the
/// trainer over its CausalLm chunks and the data sampler. `slot` is the activation slot of
/// (microbatch, chunk) (PipelineExecutor::slot_of): the F, B and W of one (micro-batch, chunk)
/// get the same one, and no two in flight share one.
class StageRunner {
 public:
  virtual ~StageRunner() = default;
  /// F of (microbatch, local chunk). `input`: the activation received from the previous chunk
  /// (empty for the model's first chunk, which reads tokens). Returns the activation for the
  /// next chunk, or an empty tensor for the model's last chunk (which computes the loss).
  virtual Tensor forward(int microbatch, int chunk, int slot, const Tensor& input) = 0;
  /// Backward of (microbatch, chunk): fused (weight_grads = true), or the input gradient only
  /// with the weight gradients deferred to backward_weight. `grad_output`: received from the
  /// next chunk (empty for the last chunk). Returns the input gradient for the previous chunk,
  /// or an empty tensor for the first chunk.
  virtual Tensor backward(int microbatch, int chunk, int slot, const Tensor& grad_output,
                          bool weight_grads) = 0;
  /// W of (microbatch, chunk): the weight gradients its backward deferred.
  virtual void backward_weight(int microbatch, int chunk, int slot) = 0;
  /// Shape of an activation or gradient between chunks: [tokens, C], or [tokens/tp, C] under
  /// sequence parallelism (f32).
  virtual Shape boundary_shape() const = 0;
};

/// One executed action with its wall-clock start and end, seconds since the step started.
struct ExecutedAction {
  Action action;
  double start_s = 0.0;
  double end_s = 0.0;
};

class PipelineExecutor {
 public:
  /// The schedule of this rank (its pp-group rank); ConfigError for an invalid spec.
  PipelineExecutor(const ScheduleSpec& spec, ProcessGroup& pp);

  /// Runs one optimizer step's actions; returns them timed. Throws CommError on a failed
  /// transfer. Collective over the pp group (every stage runs its own list).
  std::vector<ExecutedAction> run_step(StageRunner& runner);

  const std::vector<Action>& actions() const noexcept { return actions_; }
  const ScheduleSpec& spec() const noexcept { return spec_; }
  /// Activation slot of (microbatch, chunk): microbatch·v + chunk.
  int slot_of(int microbatch, int chunk) const { return microbatch * spec_.v + chunk; }

 private:
  int tag_of(const Action& a) const;
  void post_receives_before(std::size_t next_compute, std::size_t from);

  ScheduleSpec spec_;
  ProcessGroup& pp_;
  std::vector<Action> actions_;
  Shape boundary_;
  // Step state: posted receives and their buffers by action index; outputs waiting to be sent
  // and inputs waiting to be consumed, by (kind, microbatch, chunk).
  std::map<std::size_t, std::pair<Tensor, std::unique_ptr<CommRequest>>> receives_;
  std::vector<std::pair<Tensor, std::unique_ptr<CommRequest>>> sends_;
  std::size_t posted_until_ = 0;
};

}  // namespace meshtrain::pp
