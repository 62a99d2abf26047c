#include "meshtrain/parallel/dp/zero_reduce.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// Kept between calls and only ever grown: the same sizes come back every step.
Tensor& grown(Tensor& buffer, std::int64_t words) {
  if (!buffer.defined() || buffer.numel() < words) {
    buffer = Tensor();  // the old buffer first: never both alive at once
    buffer = Tensor::empty({words}, MemCategory::comm);
  }
  return buffer;
}

std::int64_t slice_total(const std::vector<SlicedGrad>& grads) {
  std::int64_t total = 0;
  for (const SlicedGrad& g : grads) total += g.slice;
  return total;
}

}  // namespace

void ZeroGradReducer::plan_buckets(std::vector<SlicedGrad> grads, std::int64_t bucket_bytes,
                                   const std::function<int(const Parameter&)>& passes) {
  const std::int64_t ranks = dp_.size();
  std::int64_t bytes = 0;
  for (SlicedGrad& g : grads) {
    const std::int64_t b = g.slice * ranks * 4;
    if (buckets_.empty() || (!buckets_.back().grads.empty() && bytes + b > bucket_bytes)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& bucket = buckets_.back();
    const int n = overlap_ ? passes(*g.param) : 0;
    MT_CHECK(n >= 0, "{}: {} backward passes per step", g.param->name, n);
    tracks_[g.param] = Track{.bucket = buckets_.size() - 1, .passes = n, .done = 0};
    if (n > 0) ++bucket.tracked;
    bucket.grads.push_back(std::move(g));
    bytes += b;
  }
  for (Bucket& bucket : buckets_) bucket.waiting = bucket.tracked;
}

void ZeroGradReducer::grad_ready(const Parameter& p) {
  if (!overlap_) return;
  const auto it = tracks_.find(&p);
  if (it == tracks_.end()) return;
  Track& t = it->second;
  Bucket& bucket = buckets_[t.bucket];
  MT_CHECK(!bucket.posted,
           "{}: a gradient contribution after its bucket's reduce-scatter was posted", p.name);
  if (++t.done < t.passes) return;
  t.done = 0;
  // Only a bucket whose every parameter is tracked may go early: an untracked one's gradient
  // is final only when backward as a whole is.
  if (--bucket.waiting == 0 && bucket.tracked == static_cast<int>(bucket.grads.size())) {
    bucket.posted = true;
    post(bucket.grads, false, true);
  }
}

void ZeroGradReducer::post_remaining_buckets() {
  for (Bucket& bucket : buckets_) {
    if (bucket.posted) continue;
    bucket.posted = true;
    post(bucket.grads, false, false);
  }
}

void ZeroGradReducer::post_unit(std::vector<SlicedGrad> grads) {
  post(std::move(grads), true, true);
}

void ZeroGradReducer::post(std::vector<SlicedGrad> grads, bool accumulate, bool during_backward) {
  if (in_flight_.size() == (overlap_ ? kInFlight : 1)) complete_oldest();
  const auto idle =
      std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.busy; });
  MT_CHECK(idle != slots_.end(), "no idle reduce-scatter slot");
  Slot& slot = *idle;
  const int n_ranks = dp_.size();
  const std::int64_t total = slice_total(grads);
  float* in = grown(slot.in, n_ranks * total).f32();
  float* out = grown(slot.out, total).f32();
  // Rank-major: rank q's slices of every parameter, back to back, then rank q + 1's.
  float* at = in;
  for (int q = 0; q < n_ranks; ++q) {
    for (const SlicedGrad& g : grads) {
      const std::int64_t b = std::min(q * g.slice, g.numel);
      const std::int64_t len = std::min((q + 1) * g.slice, g.numel) - b;
      std::memcpy(at, g.param->grad.f32() + b, static_cast<std::size_t>(len) * sizeof(float));
      if (watch_ != nullptr) {  // the copy just written, still in cache
        watch_->check(*g.param, {at, static_cast<std::size_t>(len)}, b, GradReduction::replicas,
                      "reduce-scatter", dp_);
      }
      std::fill(at + len, at + g.slice, 0.0f);
      at += g.slice;
    }
  }
  slot.busy = true;
  Pending pending{
      .grads = std::move(grads),
      .accumulate = accumulate,
      .slot = static_cast<std::size_t>(idle - slots_.begin()),
      .request = dp_.ireduce_scatter_sum({in, static_cast<std::size_t>(n_ranks * total)},
                                         {out, static_cast<std::size_t>(total)})};
  in_flight_.push_back(std::move(pending));
  if (!overlap_) {
    complete_oldest();  // one transfer at a time, as a blocking call
  } else if (during_backward) {
    ++left_in_flight_;
  }
}

void ZeroGradReducer::complete_oldest() {
  Pending& pending = in_flight_.front();
  pending.request->wait();
  Slot& slot = slots_[pending.slot];
  const float inv = 1.0f / static_cast<float>(dp_.size());
  const float* out = slot.out.f32();
  for (SlicedGrad& g : pending.grads) {
    float* dst = g.owned.f32();
    const std::int64_t len = g.owned.numel();
    for (std::int64_t k = 0; k < len; ++k) {
      dst[k] = (pending.accumulate ? dst[k] : 0.0f) + out[k] * inv;
    }
    out += g.slice;
  }
  slot.busy = false;
  in_flight_.pop_front();
}

void ZeroGradReducer::progress() {
  for (Pending& pending : in_flight_) pending.request->test();
}

void ZeroGradReducer::finish_step() {
  while (!in_flight_.empty()) complete_oldest();
  posted_in_backward_ = left_in_flight_;
  left_in_flight_ = 0;
  for (Bucket& bucket : buckets_) {
    bucket.posted = false;
    bucket.waiting = bucket.tracked;
  }
  for (auto& [p, t] : tracks_) t.done = 0;  // a step cut short must not carry counts over
}

Tensor& ZeroGradReducer::idle_buffer(int which, std::int64_t words) {
  MT_CHECK(in_flight_.empty(), "a buffer of {} reduce-scatters in flight requested",
           in_flight_.size());
  return grown(which == 0 ? slots_[0].in : slots_[0].out, words);
}

}  // namespace meshtrain
