#include "meshtrain/parallel/dp/zero.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/core/half.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain {
namespace {

std::byte* bytes_of(Tensor& t) {
  return t.dtype() == DType::f32 ? reinterpret_cast<std::byte*>(t.f32())
                                 : reinterpret_cast<std::byte*>(t.u16());
}

// Writes n fp32 values as `dtype` (f32: a copy; bf16/f16: rounded to nearest even).
void store_as(const float* from, std::byte* to, std::int64_t n, DType dtype) {
  if (dtype == DType::f32) {
    std::memcpy(to, from, static_cast<std::size_t>(n) * sizeof(float));
  } else {
    cast_f32_to_16bit(from, reinterpret_cast<std::uint16_t*>(to), n, dtype);
  }
}

// Adds the seconds of its scope to `total` (the hooks' gradient-reduction time).
class ScopeSeconds {
 public:
  explicit ScopeSeconds(double& total) : total_(total) {}
  ScopeSeconds(const ScopeSeconds&) = delete;
  ScopeSeconds& operator=(const ScopeSeconds&) = delete;
  ~ScopeSeconds() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

ZeroSharding::ZeroSharding(const ParameterList& params, std::vector<ParameterList> units,
                           ProcessGroup& dp, const ZeroOptions& options)
    : dp_(dp), options_(options) {
  MT_CHECK(options.stage >= 0 && options.stage <= 3, "ZeRO stage {} outside 0–3", options.stage);
  const int stage = options.stage;
  const DType dtype = options.compute_dtype;
  const bool low = dtype != DType::f32;
  const std::int64_t n_ranks = dp.size();
  bool any_deferred = false;
  const auto initial_values = [&](const Parameter& p, std::int64_t begin, std::int64_t end,
                                  float* out) {
    if (options.initial_values) {
      options.initial_values(p, begin, end, out);
    } else {
      initialize_range(p, options.seed, begin, end, out);
    }
  };
  for (Parameter* p : params) {
    // Built with deferred storage: stages 0 and 1 keep full gradients, so they get them
    // now (zero); GradBuckets (stage 0, dp > 1) allocates its buckets instead.
    const bool bucketed = stage == 0 && dp.size() > 1;
    if (!p->grad.defined() && stage <= 1 && !bucketed) {
      p->grad = Tensor::zeros(p->local_shape(), MemCategory::grads);
    }
  }
  if (stage == 0) {
    buckets_ =
        std::make_unique<GradBuckets>(params, dp, options.bucket_bytes, options.non_finite_watch);
  }
  if (stage >= 1) {
    reducer_ = std::make_unique<ZeroGradReducer>(dp, options.overlap_grad_reduce,
                                                 options.non_finite_watch);
  }
  for (Parameter* p : params) {
    const bool deferred = !p->value.defined();  // built with deferred storage
    any_deferred = any_deferred || deferred;
    MT_CHECK(deferred || p->value.dtype() == DType::f32, "{}: ZeRO takes over fp32 parameters",
             p->name);
    Slot s{.shape = p->local_shape(),
           .numel = 0,
           .slice = 0,
           .refs = 0,
           .units = 0,
           .backward_left = 0};
    s.numel = shape_numel(s.shape);
    s.slice = zero_slice(stage, s.numel, static_cast<int>(n_ranks), low);
    index_.emplace(p, slots_.size());
    slots_.push_back(s);
    const std::int64_t begin = owned_begin(s, dp.rank()), end = owned_end(s, dp.rank());
    OptimizerShard shard{.param = p, .begin = begin, .end = end, .master = {}, .grad = {}};
    const MemCategory master_category =
        stage == 3 && !low ? MemCategory::params : MemCategory::optimizer;
    if (!low && stage <= 2) {
      // fp32 parameters are their own master: a view of this rank's slice, no copy.
      if (deferred) p->value = Tensor::zeros(s.shape, MemCategory::params);
      shard.master = p->value.reshape({s.numel}).rows(begin, end);
      if (deferred) initial_values(*p, begin, end, shard.master.f32());
    } else if (deferred) {
      // Only this rank's slice is initialised: the values of [begin, end) alone.
      shard.master = Tensor::empty({end - begin}, master_category);
      initial_values(*p, begin, end, shard.master.f32());
    } else {
      shard.master = p->value.reshape({s.numel}).rows(begin, end).clone(master_category);
    }
    shard.grad = stage <= 1 ? p->grad.reshape({s.numel}).rows(begin, end)
                            : Tensor::zeros({end - begin}, MemCategory::grads);
    if (stage == 3) {
      p->value = Tensor();
    } else if (low) {
      p->value = deferred ? Tensor::empty(s.shape, MemCategory::params, dtype)
                          : p->value.to(dtype, MemCategory::params);
    }
    if (stage >= 2) p->grad = Tensor();
    shards_.push_back(std::move(shard));
  }
  // Deferred parameters of stages 0–2 hold only this rank's initialised slice (or nothing, in
  // 16 bits): the masters, published, fill every rank's full parameters. Collective over dp.
  if (any_deferred && stage <= 2) publish_parameters();
  options_.initial_values =
      nullptr;  // the constructor's alone: what it captured may not outlive it
  // Stages 2 and 3 act only through the hooks: a parameter outside every unit would never
  // have its gradient reduced or its value gathered.
  for (const ParameterList& unit : units) {
    for (const Parameter* p : unit)
      MT_CHECK(index_.contains(p), "{}: in a unit, not in ZeRO", p->name);
  }
  std::size_t covered = 0;
  for (const ParameterList& unit : units) {
    for (const Parameter* p : unit) {
      Slot& s = slots_[index_.at(p)];
      if (s.units++ == 0) ++covered;
      s.backward_left = s.units;
    }
  }
  MT_CHECK(options.stage < 2 || covered == params.size(), "{} of {} parameters in no unit",
           params.size() - covered, params.size());
  // Stages 0 and 1: a unit's gradients are final after its backward of the last micro-batch.
  const auto passes = [this, m = options.microbatches](const Parameter& p) {
    return slots_[index_.at(&p)].units * m;
  };
  if (buckets_ && options.overlap_grad_reduce) buckets_->enable_overlap(passes);
  if (stage == 1) {
    std::vector<SlicedGrad> all;
    for (const OptimizerShard& shard : shards_) all.push_back(sliced(*shard.param));
    reducer_->plan_buckets(std::move(all), options.bucket_bytes, passes);
  }
}

SlicedGrad ZeroSharding::sliced(const Parameter& p) {
  const std::size_t i = index_.at(&p);
  return {
      .param = &p, .numel = slots_[i].numel, .slice = slots_[i].slice, .owned = shards_[i].grad};
}

std::size_t ZeroSharding::buckets_posted_in_backward() const noexcept {
  if (buckets_) return buckets_->posted_in_backward();
  return reducer_ ? reducer_->posted_in_backward() : 0;
}

ZeroSharding::Slot& ZeroSharding::slot(const Parameter& p) {
  const auto it = index_.find(&p);
  MT_CHECK(it != index_.end(), "{} is not managed by ZeRO", p.name);
  return slots_[it->second];
}

std::int64_t ZeroSharding::owned_begin(const Slot& s, int rank) const {
  if (options_.stage == 0) return 0;  // every rank owns everything
  return std::min(static_cast<std::int64_t>(rank) * s.slice, s.numel);
}

std::int64_t ZeroSharding::owned_end(const Slot& s, int rank) const {
  if (options_.stage == 0) return s.numel;
  return std::min(static_cast<std::int64_t>(rank + 1) * s.slice, s.numel);
}

std::int64_t ZeroSharding::slice_total(const ParameterList& params) const {
  std::int64_t total = 0;
  for (const Parameter* p : params) total += slots_[index_.at(p)].slice;
  return total;
}

void ZeroSharding::pack_masters(const ParameterList& params, Tensor& send) {
  const DType dtype = options_.compute_dtype;
  const std::size_t elem = dtype_size(dtype);
  std::byte* at = reinterpret_cast<std::byte*>(send.f32());
  for (const Parameter* p : params) {
    const std::size_t i = index_.at(p);
    const std::int64_t len = shards_[i].end - shards_[i].begin;
    store_as(shards_[i].master.f32(), at, len, dtype);
    std::memset(at + static_cast<std::size_t>(len) * elem, 0,
                static_cast<std::size_t>(slots_[i].slice - len) * elem);
    at += static_cast<std::size_t>(slots_[i].slice) * elem;
  }
}

void ZeroSharding::unpack_values(const ParameterList& params, const Tensor& recv) {
  const std::size_t elem = dtype_size(options_.compute_dtype);
  const auto* at = reinterpret_cast<const std::byte*>(recv.f32());
  for (int q = 0; q < dp_.size(); ++q) {
    for (Parameter* p : params) {
      const Slot& s = slots_[index_.at(p)];
      const std::int64_t b = owned_begin(s, q), len = owned_end(s, q) - b;
      std::memcpy(bytes_of(p->value) + static_cast<std::size_t>(b) * elem, at,
                  static_cast<std::size_t>(len) * elem);
      at += static_cast<std::size_t>(s.slice) * elem;
    }
  }
}

void ZeroSharding::reduce_gradients() {
  backward_seconds_ = std::exchange(hook_seconds_, 0.0);
  if (options_.stage == 0) {
    buckets_->all_reduce_mean();
    return;
  }
  // Stage 1: the buckets backward did not post; stages 2–3 posted every unit's in its hook.
  if (options_.stage == 1) reducer_->post_remaining_buckets();
  reducer_->finish_step();
}

void ZeroSharding::publish_parameters() {
  const DType dtype = options_.compute_dtype;
  if (options_.stage == 0) {
    if (dtype == DType::f32) return;  // the master is the parameter
    for (OptimizerShard& shard : shards_) {
      store_as(shard.master.f32(), bytes_of(shard.param->value), shard.master.numel(), dtype);
    }
    return;
  }
  if (options_.stage == 3) return;  // gathered before each use
  ParameterList bucket;
  std::int64_t bytes = 0;
  const auto flush = [&] {
    const std::int64_t total = slice_total(bucket);
    const std::int64_t words = total * static_cast<std::int64_t>(dtype_size(dtype)) / 4;
    // Slot 0 of the gradient reduce-scatters, idle between steps: receive into its input,
    // send from its output (N·words and words: the sizes of its own use).
    Tensor& send = reducer_->idle_buffer(1, words);
    Tensor& recv = reducer_->idle_buffer(0, words * dp_.size());
    pack_masters(bucket, send);
    dp_.all_gather({send.f32(), static_cast<std::size_t>(words)},
                   {recv.f32(), static_cast<std::size_t>(words * dp_.size())});
    unpack_values(bucket, recv);
    bucket.clear();
    bytes = 0;
  };
  for (const OptimizerShard& shard : shards_) {
    const std::int64_t b = slots_[index_.at(shard.param)].slice * dp_.size() *
                           static_cast<std::int64_t>(dtype_size(dtype));
    if (!bucket.empty() && bytes + b > options_.bucket_bytes) flush();
    bucket.push_back(shard.param);
    bytes += b;
  }
  if (!bucket.empty()) flush();
}

void ZeroSharding::zero_grad(bool shards_zeroed) {
  zero_spans_.clear();  // keeps its capacity: nothing is allocated after the first step
  for (OptimizerShard& shard : shards_) {
    if (options_.stage >= 2) {  // the slice is the only gradient between steps
      if (!shards_zeroed && shard.grad.numel() > 0) zero_spans_.push_back(shard.grad.span_bytes());
      continue;
    }
    // Stages 0–1: the shard is elements [begin, end) of the full gradient.
    const std::span<std::byte> full = shard.param->grad.span_bytes();
    if (!shards_zeroed) {
      if (!full.empty()) zero_spans_.push_back(full);
      continue;
    }
    const auto begin = static_cast<std::size_t>(shard.begin) * sizeof(float);
    const auto end = static_cast<std::size_t>(shard.end) * sizeof(float);
    if (begin > 0) zero_spans_.push_back(full.first(begin));
    if (end < full.size()) zero_spans_.push_back(full.subspan(end));
  }
  kernels::zero_all(zero_spans_);
}

namespace {
// Gathers every rank's [slice] f32 piece of a parameter and keeps the real elements.
Tensor gather_slices(ProcessGroup& dp, const Tensor& mine, std::int64_t slice, const Shape& shape) {
  const std::int64_t numel = shape_numel(shape);
  Tensor send = Tensor::zeros({slice}, MemCategory::comm);
  std::memcpy(send.f32(), mine.f32(), static_cast<std::size_t>(mine.numel()) * sizeof(float));
  Tensor recv = Tensor::empty({slice * dp.size()}, MemCategory::comm);
  dp.all_gather(send.span_f32(), recv.span_f32());
  Tensor full = Tensor::empty(shape, MemCategory::other);
  std::memcpy(full.f32(), recv.f32(), static_cast<std::size_t>(numel) * sizeof(float));
  return full;
}
}  // namespace

Tensor ZeroSharding::gather_master(const Parameter& p) {
  const Slot& s = slot(p);
  const OptimizerShard& shard = shards_[index_.at(&p)];
  if (options_.stage == 0) return shard.master.clone(MemCategory::other).reshape(s.shape);
  return gather_slices(dp_, shard.master, s.slice, s.shape);
}

Tensor ZeroSharding::gather_grad(const Parameter& p) {
  const Slot& s = slot(p);
  const OptimizerShard& shard = shards_[index_.at(&p)];
  if (options_.stage == 0) return shard.grad.clone(MemCategory::other).reshape(s.shape);
  return gather_slices(dp_, shard.grad, s.slice, s.shape);
}

void ZeroSharding::post_gather(const ParameterList& unit, PendingGather& out) {
  const DType dtype = options_.compute_dtype;
  const std::int64_t total = slice_total(unit);
  const std::int64_t words = (total * static_cast<std::int64_t>(dtype_size(dtype)) + 3) / 4;
  out.unit = &unit;
  out.send = Tensor::empty({words}, MemCategory::comm);
  out.recv = Tensor::empty({words * dp_.size()}, MemCategory::comm);
  pack_masters(unit, out.send);
  out.request = dp_.iall_gather(out.send.span_f32(), out.recv.span_f32());
}

void ZeroSharding::gather_unit(const ParameterList& unit) {
  if (pending_ && pending_->unit != &unit) {
    pending_->request->wait();  // a prefetch the model did not use (order changed): dropped
    pending_.reset();
  }
  if (!pending_) post_gather(unit, pending_.emplace());
  pending_->request->wait();
  for (Parameter* p : unit) {
    Slot& s = slot(*p);
    if (s.refs++ == 0) p->value = Tensor::empty(s.shape, MemCategory::comm, options_.compute_dtype);
  }
  unpack_values(unit, pending_->recv);  // a value already held is rewritten with equal bytes
  pending_.reset();
}

void ZeroSharding::release_unit_values(const ParameterList& unit) {
  for (Parameter* p : unit) {
    Slot& s = slot(*p);
    MT_CHECK(s.refs > 0, "{}: released more often than gathered", p->name);
    if (--s.refs == 0) p->value = Tensor();
  }
}

void ZeroSharding::before_forward(const ParameterList& unit, const ParameterList* next) {
  if (reducer_ && options_.overlap_grad_reduce) {
    const ScopeSeconds timed(hook_seconds_);
    reducer_->progress();  // the last micro-batch's tail, under the next one's forward
  }
  if (options_.stage < 3) return;
  gather_unit(unit);
  if (next) post_gather(*next, pending_.emplace());
}

void ZeroSharding::after_forward(const ParameterList& unit) {
  if (options_.stage == 3) release_unit_values(unit);
}

void ZeroSharding::before_backward(const ParameterList& unit, const ParameterList* next) {
  if (options_.overlap_grad_reduce) {
    const ScopeSeconds timed(hook_seconds_);
    if (buckets_) buckets_->progress();  // MPI moves posted buckets only inside MPI calls
    if (reducer_) reducer_->progress();  // and our rings' steps only inside test()
  }
  if (options_.stage < 2) return;
  for (Parameter* p : unit) {
    // The unit's full gradient exists only during its backward: a communication buffer.
    if (!p->grad.defined()) p->grad = Tensor::zeros(slot(*p).shape, MemCategory::comm);
  }
  if (options_.stage < 3) return;
  gather_unit(unit);
  if (next) post_gather(*next, pending_.emplace());
}

void ZeroSharding::after_backward(const ParameterList& unit) {
  const ScopeSeconds timed(hook_seconds_);
  if (buckets_ && buckets_->overlap()) {
    for (const Parameter* p : unit) buckets_->grad_ready(*p);
    buckets_->progress();
  }
  if (options_.stage == 1 && options_.overlap_grad_reduce) {
    for (const Parameter* p : unit) reducer_->grad_ready(*p);
    reducer_->progress();
  }
  if (options_.stage < 2) return;
  // A parameter in several units (gpt2's tied token embedding: the embedding and the head)
  // keeps its full gradient until the last of them has run backward, and is reduce-scattered
  // once per micro-batch, not once per unit.
  ParameterList complete;
  for (Parameter* p : unit) {
    Slot& s = slot(*p);
    if (--s.backward_left > 0) continue;
    s.backward_left = s.units;
    complete.push_back(p);
  }
  if (!complete.empty()) {
    std::vector<SlicedGrad> grads;
    for (const Parameter* p : complete) grads.push_back(sliced(*p));
    reducer_->post_unit(std::move(grads));  // copies the gradients: they may go
  }
  for (Parameter* p : complete) p->grad = Tensor();
  reducer_->progress();
  if (options_.stage == 3) release_unit_values(unit);
}

}  // namespace meshtrain
