#include "meshtrain/parallel/dp/grad_buckets.h"

#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain {

GradBuckets::GradBuckets(const ParameterList& params, ProcessGroup& dp, std::int64_t bucket_bytes,
                         NonFiniteGradWatch* watch)
    : dp_(dp), watch_(watch) {
  if (dp.size() == 1) return;
  std::vector<Parameter*> current;
  std::int64_t current_elements = 0;
  auto close = [&] {
    if (current.empty()) return;
    // Release the parameters' own gradients before allocating the bucket, so that the peak of
    // MemCategory::grads is one copy of the gradients, not two.
    std::vector<Shape> shapes;
    for (Parameter* p : current) {
      if (p->grad.defined()) {  // undefined: built with deferred storage
        for (const float v : p->grad.span_f32()) {
          MT_CHECK(v == 0.0f, "{}: GradBuckets must be built before any backward", p->name);
        }
      }
      shapes.push_back(p->local_shape());
      p->grad = Tensor();
    }
    // On one node the bucket lives in a shared-memory window, whose all-reduce is loads and
    // stores instead of messages (ProcessGroup::allocate_shared).
    Tensor buffer = dp_.allocate_shared(current_elements, MemCategory::grads);
    const bool shared = buffer.defined();
    if (!shared) buffer = Tensor::zeros({current_elements}, MemCategory::grads);
    Bucket bucket{current, std::move(buffer), shared, nullptr, 0, 0};
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

void GradBuckets::enable_overlap(const std::function<int(const Parameter&)>& passes) {
  overlap_ = true;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.tracked = 0;
    for (const Parameter* p : bucket.params) {
      const int n = passes(*p);
      MT_CHECK(n >= 0, "{}: {} backward passes per step", p->name, n);
      tracks_[p] = Track{.bucket = b, .passes = n, .done = 0};
      if (n > 0) ++bucket.tracked;
    }
    bucket.waiting = bucket.tracked;
  }
}

void GradBuckets::post(Bucket& bucket) {
  if (watch_ != nullptr && !bucket.shared) {  // a shared bucket's all-reduce checks as it sums
    for (const Parameter* p : bucket.params) {
      watch_->check(*p, p->grad.span_f32(), 0, GradReduction::replicas, "all-reduce", dp_);
    }
  }
  // The mean's 1/dp is taken as each sum is stored (one pass over the bucket fewer).
  bucket.request =
      dp_.iall_reduce_sum(bucket.buffer.span_f32(), 1.0f / static_cast<float>(dp_.size()));
}

void GradBuckets::note_non_finite_input(const Bucket& bucket) {
  const std::optional<NonFiniteInput> bad = bucket.request->first_non_finite_input();
  if (!bad) return;
  // The bucket's element → the parameter whose gradient holds it (back to back, in order).
  std::int64_t offset = 0;
  for (const Parameter* p : bucket.params) {
    const std::int64_t n = p->grad.numel();
    if (bad->element < offset + n) {
      watch_->note(*p, bad->element - offset, bad->value, GradReduction::replicas, "all-reduce",
                   dp_);
      return;
    }
    offset += n;
  }
}

void GradBuckets::grad_ready(const Parameter& p) {
  if (!overlap_) return;
  const auto it = tracks_.find(&p);
  if (it == tracks_.end()) return;  // dp = 1: no buckets
  Track& t = it->second;
  Bucket& bucket = buckets_[t.bucket];
  MT_CHECK(!bucket.request, "{}: a gradient contribution after its bucket's all-reduce was posted",
           p.name);
  if (++t.done < t.passes) return;
  t.done = 0;
  // Only a bucket whose every parameter is tracked may go early: an untracked one's gradient
  // is final only when backward as a whole is.
  if (--bucket.waiting == 0 && bucket.tracked == static_cast<int>(bucket.params.size())) {
    post(bucket);
  }
}

void GradBuckets::progress() {
  for (Bucket& bucket : buckets_) {
    if (bucket.request) bucket.request->test();
  }
}

void GradBuckets::all_reduce_mean() {
  if (dp_.size() == 1) return;
  posted_in_backward_ = 0;
  for (Bucket& bucket : buckets_) {
    if (bucket.request) {
      ++posted_in_backward_;
    } else {
      post(bucket);
      if (!overlap_) bucket.request->wait();  // one transfer at a time, as a blocking call
    }
  }
  for (Bucket& bucket : buckets_) {
    bucket.request->wait();
    if (watch_ != nullptr && bucket.shared) note_non_finite_input(bucket);
    bucket.request.reset();
    bucket.waiting = bucket.tracked;
  }
  for (auto& [p, t] : tracks_) t.done = 0;  // a step cut short must not carry counts over
}

}  // namespace meshtrain
