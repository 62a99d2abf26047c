// src/meshtrain/layers/weight_grad_queue.h
//
// Deferred weight gradients for zero-bubble pipeline schedules (Qi et al. 2023, §2): the
// backward of a linear layer splits into B, the input gradient dX = dY·W that the previous
// stage waits for, and W, the weight gradient dW += dYᵀ·X that nobody waits for and can fill
// the pipeline's bubbles later.
//
// When a backward's MicroBatchContext names a queue (defer_weight_grads, micro_batch_context.h)
// the matmul layers — ColumnParallelLinear, RowParallelLinear and VocabParallelLmHead —
// compute only dX (and their biases' gradients) and push their weight-gradient GEMMs into
// that queue under the context's activation slot (activation_slots.h);
// WeightGradQueue::run(slot) computes them later. All other gradients (norms, embeddings,
// biases) are cheap and computed at once as without a queue. Without one nothing changes:
// backward is fused.
//
// B + W gives bitwise the gradients of the fused backward: kernels::linear_backward computes
// dX and dW with two separate GEMMs anyway, so B is the same dX GEMM and W the same dW GEMM
// (same shapes, same accumulation into the grad), only later. Each weight's gradient gets its
// contributions in the same order as long as the Ws of a weight run in the order its fused
// backwards would have (W0 before W1 when B0 ran before B1). The exception is a weight that
// also gets a gradient computed at once, i.e. an LM head tied to the token embedding: its
// embedding part is added during B, its head part during W, so the order of the additions
// changes and the sum matches within rounding, not bitwise.
//
// The queue keeps x and dy by reference (shared storage, no copy): the tensors a layer saved
// live on until their W has run, and the caller must not overwrite an output gradient it gave
// to a backward (e.g. reuse a receive buffer) before that backward's W has run. A weight's
// gradient is complete only after every pending W that touches it has run (gradient
// reduction and the optimizer step come after the last W). One queue per model chunk: slots
// (micro-batch indices) of different chunks on one rank must not share a queue.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "meshtrain/core/tensor.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/micro_batch_context.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// One deferred weight-gradient GEMM: weight->grad [out, in] (f32) += dyᵀ·x. x and dy are
/// both f32, or both of the weight's 16-bit dtype under mixed precision (layers/autocast.h).
struct WeightGradTask {
  Tensor x;           // [tokens, in], the input forward multiplied by the weight (shared)
  Tensor dy;          // [tokens, out], the gradient of that product (shared, or its 16-bit copy)
  Parameter* weight;  // whose grad receives the sum; read at run time, not at push
  kernels::LinearDims dims;
};

class WeightGradQueue {
 public:
  WeightGradQueue() = default;
  WeightGradQueue(const WeightGradQueue&) = delete;
  WeightGradQueue& operator=(const WeightGradQueue&) = delete;

  /// Appends `task` to the slot's list.
  void push(int slot, WeightGradTask task);
  /// Computes the slot's tasks in the order they were pushed (kernels::linear_backward with
  /// dx = nullptr, dw = the weight's grad), then frees them (x and dy are released). Nothing
  /// pending: nothing to do.
  void run(int slot);
  /// Tasks pending under `slot`.
  std::size_t pending(int slot) const;
  /// Tasks pending under every slot.
  std::size_t pending() const;
  /// Drops every pending task without computing it (an abandoned step).
  void clear();

 private:
  std::map<int, std::vector<WeightGradTask>> by_slot_;
};

/// The matmul layers' backward of y = x·Wᵀ (+ b): dx = dy·W (overwritten; nullptr: not
/// computed) and db += Σ dy (nullptr: no bias) at once; weight.grad += dyᵀ·x at once, or,
/// when ctx names a queue (ctx.defer_weight_grads), queued there under ctx.slot.
/// dy is f32; x is what forward kept, matmul_input(x, weight) (layers/autocast.h). With a
/// 16-bit weight both GEMMs run in its dtype with f32 accumulation: dy is rounded to it (a new
/// tensor, which a deferred task keeps instead of dy; under f16 an |dy| above 65504 becomes
/// inf, for the loss scaler to find in the gradients), dx comes out f32 and dW accumulates
/// into the f32 grad. db is summed from the f32 dy.
void linear_backward_or_defer(const Tensor& x, Parameter& weight, const Tensor& dy, float* dx,
                              float* db, const kernels::LinearDims& dims,
                              const MicroBatchContext& ctx);

}  // namespace meshtrain
