// src/meshtrain/parallel/tp/gather.h — a parameter's logical tensor from its tensor-parallel
// shards: for the final checkpoint, which stores logical tensors without padding whatever the
// layout, and for the equivalence tests, which compare against the tp = 1 run.
#pragma once

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// The logical tensor (shape p.shard.logical_shape, padding dropped) of `which` (p.value or
/// p.grad) on every rank of `tp`. A parameter replicated over tp is copied; a sharded one must
/// be the even_shard of this group (MT_CHECK) and is all-gathered. Collective over tp.
/// Returns MemCategory::other memory.
Tensor gather_logical(const Parameter& p, const Tensor& which, ProcessGroup& tp);

}  // namespace meshtrain
