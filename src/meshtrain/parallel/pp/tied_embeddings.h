// src/meshtrain/parallel/pp/tied_embeddings.h — gpt2's tied token embedding under pipeline
// parallelism (Megatron-LM's "embedding group"): the first stage holds the input embedding,
// the last the LM head, one logical weight in two copies. Their gradients are summed between
// the two stages once per step, after the data-parallel reduction, so both copies take the
// same update and stay equal.
#pragma once

#include <memory>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/non_finite_grads.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// The group of pp ranks 0 and pp − 1, which hold the two copies; the middle stages get a
/// group of their own they never use (the split is collective over `pp`).
std::unique_ptr<ProcessGroup> tied_embedding_group(ProcessGroup& pp);

/// Sums the gradients of the tied embedding's copies this rank holds (`tied`: none, one, or
/// both when pp = 1) over `tied_group` (pp ranks 0 and pp − 1; nullptr on one stage), on the
/// optimizer shards' gradients (`shards`: f32; both copies have the same shape, so a ZeRO rank
/// owns the same slice of each, and the sum of slices is the slice of the sum). Afterwards
/// every copy holds the sum. With `watch`, checks what goes into the sum between stages
/// (GradReduction::tied_embedding). Collective over `tied_group` on the ranks that hold a copy.
void sum_tied_embeddings(const ParameterList& tied, ProcessGroup* tied_group,
                         OptimizerShards& shards, NonFiniteGradWatch* watch);

}  // namespace meshtrain
