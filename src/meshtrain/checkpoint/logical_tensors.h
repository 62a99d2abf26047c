// src/meshtrain/checkpoint/logical_tensors.h — the whole model's logical tensors on every rank,
// gathered from a layout's pieces (tp shards, ep's experts, pp's stages, ZeRO slices): what the
// final checkpoint and the Hugging Face export write, whatever the layout.
#pragma once

#include <functional>
#include <vector>

#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// Every logical tensor of the model (f32, logical shapes, padding dropped; expert tensors of
/// each MoE block in expert order; stages in pp order; a tied copy once), on every rank of
/// `mesh`. `params`: this rank's stage's parameters; `master(p)`: p's whole fp32 value on this
/// rank (ZeRO's gather over p's replica group, collective over it). Collective over tp, ep and
/// pp of `mesh` (and the replica groups, through `master`). MemCategory::other memory.
std::vector<NamedTensor> gather_logical_tensors(
    const ParameterList& params, const std::function<Tensor(const Parameter&)>& master,
    const DeviceMesh& mesh);

}  // namespace meshtrain
