// src/meshtrain/transformer/parallel_groups.h
//
// The groups a layer may use, passed as one collection (Megatron-core's ProcessGroupCollection
// idea): tensor parallel (with sequence parallel), context parallel and expert parallel, plus
// the token group of a MoE layer's losses. A group of one rank makes every parallel layer the
// plain one. Each dimension's own group type lives in its folder (parallel/{tp,cp,ep}).
#pragma once

#include <cstdint>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/parallel/cp/context_parallel.h"
#include "meshtrain/parallel/ep/expert_parallel.h"
#include "meshtrain/parallel/tp/tp_regions.h"

namespace meshtrain {

/// The ranks that each hold part of one micro-batch's tokens — the cp group, times tp under
/// sequence parallelism — over which a MoE layer's aux and z losses are taken (nullptr: one
/// rank holds them all). `grad_factor` = cp: the dp × cp mean of the gradients would divide
/// the cp ranks' shares of one micro-batch's loss by cp (tp ranks' shares are summed, as every
/// replicated weight's under sequence parallelism).
struct MoeTokenGroup {
  ProcessGroup* group = nullptr;
  int grad_factor = 1;
};

/// Every group a layer may communicate over. Implicitly made from a TensorParallel (cp = 1,
/// ep = 1), so single-dimension call sites stay as they are.
struct ParallelGroups {
  TensorParallel tp;
  ContextParallel cp;
  ExpertParallel ep;
  MoeTokenGroup moe_tokens;

  ParallelGroups(const TensorParallel& tp_, ContextParallel cp_ = {},  // NOLINT: implicit
                 ExpertParallel ep_ = {}, MoeTokenGroup moe_tokens_ = {})
      : tp(tp_), cp(cp_), ep(ep_), moe_tokens(moe_tokens_) {}
};

}  // namespace meshtrain
