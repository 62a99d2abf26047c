#include "meshtrain/parallel/dp/grad_buckets.h"

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

GradBuckets::GradBuckets(const ParameterList& params, ProcessGroup& dp, std::int64_t bucket_bytes)
    : dp_(dp) {
  if (dp.size() == 1) return;
  std::vector<Parameter*> current;
  std::int64_t current_elements = 0;
  auto close = [&] {
    if (current.empty()) return;
    Bucket bucket{current, Tensor::empty({current_elements}, MemCategory::grads)};
    std::int64_t offset = 0;
    for (Parameter* p : current) {
      Tensor view = bucket.buffer.rows(offset, offset + p->grad.numel()).reshape(p->grad.shape());
      view.copy_from(p->grad);
      p->grad = view;
      offset += view.numel();
    }
    buckets_.push_back(std::move(bucket));
    current.clear();
    current_elements = 0;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const std::int64_t elements = (*it)->grad.numel();
    if (current_elements > 0 && (current_elements + elements) * 4 > bucket_bytes) close();
    current.push_back(*it);
    current_elements += elements;
  }
  close();
}

void GradBuckets::all_reduce_mean() {
  if (dp_.size() == 1) return;
  const float inv = 1.0f / static_cast<float>(dp_.size());
  for (Bucket& bucket : buckets_) {
    dp_.all_reduce_sum(bucket.buffer.span_f32());
    kernels::scale_inplace(bucket.buffer.f32(), inv, bucket.buffer.numel());
  }
}

}  // namespace meshtrain
