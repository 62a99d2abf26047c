#include "meshtrain/parallel/dp/grad_buckets.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

GradBuckets::GradBuckets(const ParameterList& params, ProcessGroup& dp, std::int64_t bucket_bytes)
    : dp_(dp) {
  if (dp.size() == 1) return;
  std::vector<Parameter*> current;
  std::int64_t current_elements = 0;
  auto close = [&] {
    if (current.empty()) return;
    // Release the parameters' own gradients before allocating the bucket, so that the peak of
    // MemCategory::grads is one copy of the gradients, not two.
    std::vector<Shape> shapes;
    for (Parameter* p : current) {
      if (p->grad.defined()) {  // undefined: built under DeferParameterStorage
        for (const float v : p->grad.span_f32()) {
          MT_CHECK(v == 0.0f, "{}: GradBuckets must be built before any backward", p->name);
        }
      }
      shapes.push_back(p->local_shape());
      p->grad = Tensor();
    }
    Bucket bucket{current, Tensor::zeros({current_elements}, MemCategory::grads)};
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < current.size(); ++i) {
      const std::int64_t n = shape_numel(shapes[i]);
      current[i]->grad = bucket.buffer.rows(offset, offset + n).reshape(shapes[i]);
      offset += n;
    }
    buckets_.push_back(std::move(bucket));
    current.clear();
    current_elements = 0;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const std::int64_t elements = shape_numel((*it)->local_shape());
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
