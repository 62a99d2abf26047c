#include "meshtrain/parallel/tp/replicated_grads.h"

#include <cstring>

namespace meshtrain {

ReplicatedGradSum::ReplicatedGradSum(const OptimizerShards& shards, ProcessGroup& tp,
                                     NonFiniteGradWatch* watch)
    : tp_(tp), watch_(watch) {
  std::int64_t n = 0;
  for (const OptimizerShard& s : shards) {
    if (s.param->placement.sum_over_tp) {
      picked_.push_back(s);
      n += s.grad.numel();
    }
  }
  if (n > 0) buffer_ = Tensor::empty({n}, MemCategory::comm);
}

void ReplicatedGradSum::all_reduce() {
  if (!buffer_.defined()) return;
  // Pack, reduce once, unpack: one message instead of one per (small) parameter.
  float* at = buffer_.f32();
  for (const OptimizerShard& s : picked_) {
    std::memcpy(at, s.grad.f32(), static_cast<std::size_t>(s.grad.bytes()));
    if (watch_ != nullptr) {
      watch_->check(*s.param, {at, static_cast<std::size_t>(s.grad.numel())}, s.begin,
                    GradReduction::sequence_parallel, "sequence-parallel sum", tp_);
    }
    at += s.grad.numel();
  }
  tp_.all_reduce_sum(buffer_.span_f32());
  at = buffer_.f32();
  for (OptimizerShard& s : picked_) {
    std::memcpy(s.grad.f32(), at, static_cast<std::size_t>(s.grad.bytes()));
    at += s.grad.numel();
  }
}

}  // namespace meshtrain
