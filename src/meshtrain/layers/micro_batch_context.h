// src/meshtrain/layers/micro_batch_context.h
//
// What one forward or backward call needs to know about the micro-batch it runs for, passed
// explicitly down the modules (no per-thread state):
//   slot                which activation slot the layers keep this micro-batch's saved tensors
//                       in (activation_slots.h); the pipeline executor uses one per
//                       (micro-batch, chunk), everything else slot 0;
//   defer_weight_grads  where the matmul layers' backwards queue their weight gradients
//                       (zero-bubble B without W, weight_grad_queue.h); nullptr: the backward
//                       is fused and computes them at once.
// The default context, {slot 0, fused}, is one micro-batch at a time: a plain forward/backward.
#pragma once

namespace meshtrain {

class WeightGradQueue;

struct MicroBatchContext {
  int slot = 0;
  WeightGradQueue* defer_weight_grads = nullptr;
};

}  // namespace meshtrain
