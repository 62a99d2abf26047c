#include "meshtrain/parallel/pp/tied_embeddings.h"

#include <vector>

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

std::unique_ptr<ProcessGroup> tied_embedding_group(ProcessGroup& pp) {
  const bool ends = pp.rank() == 0 || pp.rank() == pp.size() - 1;
  return pp.split(ends ? 0 : 1, pp.rank(), "embedding");
}

void sum_tied_embeddings(const ParameterList& tied, ProcessGroup* tied_group,
                         OptimizerShards& shards, NonFiniteGradWatch* watch) {
  std::vector<const OptimizerShard*> copies;
  for (const Parameter* p : tied) {
    for (const OptimizerShard& s : shards) {
      if (s.param == p) copies.push_back(&s);
    }
  }
  if (copies.empty()) return;
  std::vector<Tensor> grads;
  for (const OptimizerShard* s : copies) grads.push_back(s->grad);
  Tensor& grad = grads.front();
  if (grads.size() == 2) kernels::add_inplace(grad.f32(), grads[1].f32(), grad.numel());
  if (tied_group != nullptr) {
    // Between the stages the sum spreads a value; on one stage (pp = 1) it stays on this rank.
    if (watch != nullptr) {
      watch->check(*copies.front()->param, grad.span_f32(), copies.front()->begin,
                   GradReduction::tied_embedding, "sum of the tied embedding's copies",
                   *tied_group);
    }
    tied_group->all_reduce_sum(grad.span_f32());
  }
  if (grads.size() == 2) grads[1].copy_from(grad);
}

}  // namespace meshtrain
