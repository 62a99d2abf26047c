#include "meshtrain/train/stage_runner.h"

#include "meshtrain/core/trace.h"
#include "meshtrain/parallel/cp/context_parallel.h"

namespace meshtrain {

void MicroBatchReader::begin(std::int64_t step) {
  step_ = step;
  data_.clear();
}

void MicroBatchReader::fill(int microbatch) {
  auto& [tokens, targets] = data_[microbatch];
  if (!tokens.empty()) return;
  const std::size_t n = static_cast<std::size_t>(batching_.micro_batch * batching_.seq_len);
  tokens.resize(n);
  targets.resize(n);
  const std::int64_t first = data::first_sequence_of(microbatch, batching_.dp_rank,
                                                     batching_.dp_size, batching_.micro_batch);
  sampler_.fill(step_, first, batching_.micro_batch, tokens.data(), targets.data());
  tokens = zigzag_rows(tokens, batching_.micro_batch, batching_.seq_len, batching_.cp_rank,
                       batching_.cp_size);
  targets = zigzag_rows(targets, batching_.micro_batch, batching_.seq_len, batching_.cp_rank,
                        batching_.cp_size);
}

const std::vector<std::int32_t>& MicroBatchReader::tokens(int microbatch) {
  fill(microbatch);
  return data_[microbatch].first;
}

const std::vector<std::int32_t>& MicroBatchReader::targets(int microbatch) {
  fill(microbatch);
  return data_[microbatch].second;
}

Shape boundary_shape_of(PipelineStage& stage, const MicroBatching& batching) {
  const std::int64_t tokens = batching.micro_batch * batching.local_len();
  return {batching.sequence_parallel ? tokens / batching.tp_size : tokens,
          stage.chunk(0).config().n_embd};
}

StageRunner::StageRunner(PipelineStage& stage, const data::GlobalBatchSampler& sampler,
                         const MicroBatching& batching)
    : stage_(stage), batching_(batching), reader_(sampler, batching) {}

void StageRunner::begin_step(std::int64_t step) {
  reader_.begin(step);
  loss_sum_ = 0.0;
}

void StageRunner::inject_faults(Phase phase) {
  if (faults_ != nullptr) faults_->at_phase_start(phase);
}

Tensor StageRunner::forward(int microbatch, int chunk, int slot, const Tensor& input) {
  const MicroBatchContext ctx{.slot = slot};
  CausalLm& model = stage_.chunk(chunk);
  const bool first = model.layout().has_embedding;
  if (first || model.layout().has_head) {
    const trace::Scope traced(trace::Kind::data, microbatch, chunk);
    clock_.time(Phase::data, phases_, [&] { reader_.fill(microbatch); });
  }
  const trace::Scope traced(trace::Kind::forward, microbatch, chunk);
  return clock_.time(Phase::forward, phases_, [&] {
    inject_faults(Phase::forward);
    const Tensor h = model.forward_blocks(first ? reader_.tokens(microbatch).data() : nullptr,
                                          input, batching_.micro_batch, batching_.local_len(), ctx);
    if (!model.layout().has_head) return h;
    // A non-finite loss is reported by the trainer after the step, on every rank at once:
    // thrown here, on the last stage only, it would leave the other stages waiting for its
    // gradients.
    loss_sum_ += model.forward_head(h, reader_.targets(microbatch).data(), ctx);
    return Tensor();
  });
}

Tensor StageRunner::backward(int microbatch, int chunk, int slot, const Tensor& grad_output,
                             bool weight_grads) {
  const trace::Scope traced(weight_grads ? trace::Kind::backward : trace::Kind::backward_input,
                            microbatch, chunk);
  return clock_.time(Phase::backward, phases_, [&] {
    inject_faults(Phase::backward);
    return backward_untimed(chunk, slot, grad_output, weight_grads);
  });
}

Tensor StageRunner::backward_untimed(int chunk, int slot, const Tensor& grad_output,
                                     bool weight_grads) {
  CausalLm& model = stage_.chunk(chunk);
  // B without W (zero-bubble schedules): the matmul weights' gradients wait in the queue.
  const MicroBatchContext ctx{.slot = slot,
                              .defer_weight_grads = weight_grads ? nullptr : &weight_grads_};
  // Each micro-batch's loss is a mean over its tokens; the step's loss is their mean. The MoE
  // layers' aux and z losses are per micro-batch too: their gradients take the same factor.
  const float scale = loss_scale_ / static_cast<float>(batching_.microbatches);
  for (const MoeLayerRef& moe : model.moe_layers()) moe.block->set_loss_grad_scale(scale);
  const Tensor dh = model.layout().has_head ? model.backward_head(scale, ctx) : grad_output;
  return model.backward_blocks(dh, ctx);
}

void StageRunner::backward_weight(int microbatch, int chunk, int slot) {
  const trace::Scope traced(trace::Kind::backward_weight, microbatch, chunk);
  clock_.time(Phase::backward, phases_, [&] { weight_grads_.run(slot); });
}

Shape StageRunner::boundary_shape() const { return boundary_shape_of(stage_, batching_); }

EvalRunner::EvalRunner(PipelineStage& stage, const data::GlobalBatchSampler& sampler,
                       const MicroBatching& batching)
    : stage_(stage), batching_(batching), reader_(sampler, batching) {}

Tensor EvalRunner::forward(int microbatch, int chunk, int slot, const Tensor& input) {
  CausalLm& model = stage_.chunk(chunk);
  const MicroBatchContext ctx{.slot = slot};
  const bool first = model.layout().has_embedding;
  Tensor h = model.forward_blocks(first ? reader_.tokens(microbatch).data() : nullptr, input,
                                  batching_.micro_batch, batching_.local_len(), ctx);
  if (model.layout().has_head) {
    loss_sum_ += model.forward_head(h, reader_.targets(microbatch).data(), ctx);
    h = Tensor();
  }
  model.discard(ctx);  // no backward follows: free this micro-batch's activations now
  return h;
}

Tensor EvalRunner::backward(int microbatch, int chunk, int /*slot*/, const Tensor& /*grad_output*/,
                            bool /*weight_grads*/) {
  MT_CHECK(false, "evaluation runs no backward (asked for micro-batch {}, chunk {})", microbatch,
           chunk);
  return Tensor();
}

void EvalRunner::backward_weight(int microbatch, int chunk, int /*slot*/) {
  MT_CHECK(false, "evaluation runs no backward (asked for W of micro-batch {}, chunk {})",
           microbatch, chunk);
}

Shape EvalRunner::boundary_shape() const { return boundary_shape_of(stage_, batching_); }

}  // namespace meshtrain
