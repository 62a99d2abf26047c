#include "meshtrain/parallel/tp/replicated_grads.h"

#include <cstring>

namespace meshtrain {

ReplicatedGradSum::ReplicatedGradSum(const ParameterList& params, ProcessGroup& tp,
                                     bool sequence_parallel)
    : tp_(tp) {
  if (!sequence_parallel || tp.size() == 1) return;
  std::int64_t n = 0;
  for (Parameter* p : params) {
    if (!p->is_sharded()) {
      params_.push_back(p);
      n += p->grad.numel();
    }
  }
  if (n > 0) buffer_ = Tensor::empty({n}, MemCategory::comm);
}

void ReplicatedGradSum::all_reduce() {
  if (!buffer_.defined()) return;
  // Pack, reduce once, unpack: one message instead of one per (small) parameter.
  float* at = buffer_.f32();
  for (const Parameter* p : params_) {
    std::memcpy(at, p->grad.f32(), static_cast<std::size_t>(p->grad.bytes()));
    at += p->grad.numel();
  }
  tp_.all_reduce_sum(buffer_.span_f32());
  at = buffer_.f32();
  for (Parameter* p : params_) {
    std::memcpy(p->grad.f32(), at, static_cast<std::size_t>(p->grad.bytes()));
    at += p->grad.numel();
  }
}

}  // namespace meshtrain
