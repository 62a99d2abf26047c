// src/meshtrain/layers/module.h — what a transformer block is built from (norms, attention,
// MLPs): explicit forward and backward with the activations each keeps in between (one set per
// activation slot, activation_slots.h), and the registered parameters. One interface, so GPT-2
// and Llama blocks share one TransformerBlock.
#pragma once

#include <cstdint>

#include "meshtrain/config/layer_modes.h"
#include "meshtrain/layers/micro_batch_context.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// How the token rows of an activation split into sequences: tokens = sequences · seq_len,
/// row t = sequence t / seq_len, position t % seq_len. Under sequence parallelism a rank's
/// activation holds rows [r·tokens/tp, (r+1)·tokens/tp) of these.
struct SequenceBatch {
  std::int64_t sequences;
  std::int64_t seq_len;
  std::int64_t tokens() const { return sequences * seq_len; }
};

class Module {
 public:
  virtual ~Module() = default;
  /// x [tokens, C] (or [tokens/tp, C] under sequence parallelism) → same layout. Keeps what
  /// backward needs in activation slot ctx.slot (replacing what an earlier forward in that
  /// slot kept).
  virtual Tensor forward(const Tensor& x, const SequenceBatch& batch,
                         const MicroBatchContext& ctx) = 0;
  /// dy in forward's output layout → dx in its input layout, for the forward of slot
  /// ctx.slot, whose state it frees; ACCUMULATES parameter gradients (when ctx names a
  /// weight-gradient queue the matmul weights' are queued there instead, weight_grad_queue.h).
  virtual Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) = 0;
  virtual ParameterList parameters() = 0;
  /// Drops what slot ctx.slot's forward kept (activation recompute: the block runs forward
  /// again before its backward).
  virtual void discard(const MicroBatchContext& ctx) = 0;
};

}  // namespace meshtrain
