#include "meshtrain/parallel/dp/grad_buckets.h"

#include <cstring>

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

GradBuckets::GradBuckets(const ParameterList& params, ProcessGroup& dp, std::int64_t bucket_bytes)
    : dp_(dp) {
  if (dp.size() == 1) return;
  std::vector<Parameter*> current;
  std::int64_t current_bytes = 0;
  auto close = [&] {
    if (current.empty()) return;
    buckets_.push_back({current, Tensor::empty({current_bytes / 4}, MemCategory::comm)});
    current.clear();
    current_bytes = 0;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const std::int64_t bytes = (*it)->grad.bytes();
    if (current_bytes > 0 && current_bytes + bytes > bucket_bytes) close();
    current.push_back(*it);
    current_bytes += bytes;
  }
  close();
}

void GradBuckets::all_reduce_mean() {
  if (dp_.size() == 1) return;
  const float inv = 1.0f / static_cast<float>(dp_.size());
  for (Bucket& bucket : buckets_) {
    float* buf = bucket.buffer.f32();
    std::int64_t offset = 0;
    for (const Parameter* p : bucket.params) {
      std::memcpy(buf + offset, p->grad.f32(), static_cast<std::size_t>(p->grad.bytes()));
      offset += p->grad.numel();
    }
    dp_.all_reduce_sum(bucket.buffer.span_f32());
    kernels::scale_inplace(buf, inv, bucket.buffer.numel());
    offset = 0;
    for (Parameter* p : bucket.params) {
      std::memcpy(p->grad.f32(), buf + offset, static_cast<std::size_t>(p->grad.bytes()));
      offset += p->grad.numel();
    }
  }
}

}  // namespace meshtrain
