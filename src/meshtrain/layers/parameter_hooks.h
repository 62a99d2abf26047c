// src/meshtrain/layers/parameter_hooks.h
//
// Calls a model makes around each unit of parameters it uses (one transformer block, the
// embeddings, the final norm with the LM head), so a data-parallel sharding scheme can own
// where parameters and gradients live without the layers knowing: ZeRO-3 all-gathers a
// unit's parameters just before it runs and frees them after; ZeRO-2 and ZeRO-3
// reduce-scatter a unit's gradients as soon as its backward is done (Rajbhandari et al. 2020,
// "ZeRO", §5.2–5.3; PyTorch FSDP's pre/post forward and backward hooks, Zhao et al. 2023, §3).
// A model without hooks (the default) keeps every parameter and gradient where it is.
#pragma once

#include "meshtrain/layers/parameter.h"

namespace meshtrain {

class ParameterHooks {
 public:
  virtual ~ParameterHooks() = default;
  /// Before `unit` computes its forward. `next` is the unit the model will run after it in
  /// the same direction (nullptr when unknown or none), for prefetching.
  virtual void before_forward(const ParameterList& unit, const ParameterList* next) = 0;
  virtual void after_forward(const ParameterList& unit) = 0;
  /// Before `unit`'s backward (which may recompute its forward first); `next` as above, in
  /// backward order.
  virtual void before_backward(const ParameterList& unit, const ParameterList* next) = 0;
  /// After `unit`'s backward: its gradients for this micro-batch are complete.
  virtual void after_backward(const ParameterList& unit) = 0;
};

}  // namespace meshtrain
