#include "meshtrain/parallel/tp/replicated_grads.h"

#include <cstring>

namespace meshtrain {

ReplicatedGradSum::ReplicatedGradSum(const OptimizerShards& shards, ProcessGroup& tp,
                                     bool sequence_parallel)
    : tp_(tp) {
  if (!sequence_parallel || tp.size() == 1) return;
  std::int64_t n = 0;
  for (const OptimizerShard& s : shards) {
    if (!s.param->is_sharded()) {
      grads_.push_back(s.grad);
      n += s.grad.numel();
    }
  }
  if (n > 0) buffer_ = Tensor::empty({n}, MemCategory::comm);
}

void ReplicatedGradSum::all_reduce() {
  if (!buffer_.defined()) return;
  // Pack, reduce once, unpack: one message instead of one per (small) parameter.
  float* at = buffer_.f32();
  for (const Tensor& g : grads_) {
    std::memcpy(at, g.f32(), static_cast<std::size_t>(g.bytes()));
    at += g.numel();
  }
  tp_.all_reduce_sum(buffer_.span_f32());
  at = buffer_.f32();
  for (Tensor& g : grads_) {
    std::memcpy(g.f32(), at, static_cast<std::size_t>(g.bytes()));
    at += g.numel();
  }
}

}  // namespace meshtrain
