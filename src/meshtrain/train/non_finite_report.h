// src/meshtrain/train/non_finite_report.h
//
// Where a non-finite loss or gradient came from (DESIGN invariant 7, issue 17 item 8). By the
// time the loss or the grad norm is seen, a NaN or an inf has spread through the collectives
// (tp all-reduces in forward, the loss sum, the gradient reductions) to every rank, so the
// rank that looks first is not the rank it came from. These reports ask every rank what it
// contributed — its weights and local loss, or the gradients it put into each reduction
// (layers/non_finite_grads.h) — and name the rank(s), step, layer and tensor where the
// value first appeared. Every rank gets the same text; they run only on the error path.
// docs/resilience.md, "Non-finite values".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/train/optimizer_state.h"

namespace meshtrain {

/// "layer 3" for a tensor of transformer block 3 (…h.3.… or …layers.3.…), else its module:
/// "module transformer.wte" for "transformer.wte.weight".
std::string layer_of(std::string_view parameter_name);

/// After a non-finite global grad norm at step `step` (0-based): where the non-finite gradient
/// first appeared — the ranks whose own contribution to the earliest reduction that carried
/// one was non-finite (OptimizerState::first_non_finite_before_reduction) — or, when no rank
/// put one into a reduction, the first non-finite gradient after them. Collective over `world`.
std::string non_finite_grad_origin(ProcessGroup& world, const DeviceMesh& mesh,
                                   OptimizerState& optim, std::int64_t step);

/// After a non-finite loss: the first non-finite weight of each rank holding one (the fp32
/// master slices it updates, then the 16-bit copies it computes with), or, when every weight
/// is finite, the ranks whose local loss was non-finite. Collective over `world`.
std::string non_finite_loss_origin(ProcessGroup& world, const DeviceMesh& mesh,
                                   const ParameterList& params, OptimizerState& optim,
                                   double local_loss);

}  // namespace meshtrain
