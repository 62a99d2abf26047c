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

ParameterList in_group(const ParameterList& params, ReplicaGroup g) {
  ParameterList out;
  std::copy_if(params.begin(), params.end(), std::back_inserter(out),
               [g](const Parameter* p) { return p->placement.replicas == g; });
  return out;
}

}  // namespace

ZeroSharding::ZeroSharding(const ParameterList& params, const std::vector<ParameterList>& units,
                           const std::function<ReductionGroup(ReplicaGroup)>& group_of,
                           const ZeroOptions& options)
    : options_(options) {
  MT_CHECK(options.stage >= 0 && options.stage <= 3, "ZeRO stage {} outside 0–3", options.stage);
  for (const ReplicaGroup kind : {ReplicaGroup::dense, ReplicaGroup::expert}) {
    const ParameterList mine = in_group(params, kind);
    if (!mine.empty()) add_group(kind, mine, group_of(kind));
  }
  options_.initial_values =
      nullptr;  // the constructor's alone: what it captured may not outlive it
  plan_units(units);
}

void ZeroSharding::add_group(ReplicaGroup kind, const ParameterList& params,
                             const ReductionGroup& where) {
  ProcessGroup& dp = where.ranks;
  MT_CHECK(where.mean_over >= dp.size(), "{} group {}: mean over {} ranks", to_string(kind),
           dp.name(), where.mean_over);
  const int stage = options_.stage;
  const std::size_t group = groups_.size();
  Group& g = groups_.emplace_back(
      Group{.kind = kind,
            .ranks = dp,
            .rescale = static_cast<float>(dp.size()) / static_cast<float>(where.mean_over),
            .begin = slots_.size(),
            .end = slots_.size(),
            .buckets = nullptr,
            .reducer = nullptr,
            .pending = std::nullopt});
  bool any_deferred = false;
  for (Parameter* p : params) {
    // Built with deferred storage: stages 0 and 1 keep full gradients, so they get them
    // now (zero); GradBuckets (stage 0, dp > 1) allocates its buckets instead.
    const bool bucketed = stage == 0 && dp.size() > 1;
    if (!p->grad.defined() && stage <= 1 && !bucketed) {
      p->grad = Tensor::zeros(p->local_shape(), MemCategory::grads);
    }
  }
  if (stage == 0) {
    g.buckets =
        std::make_unique<GradBuckets>(params, dp, options_.bucket_bytes, options_.non_finite_watch);
  }
  if (stage >= 1) {
    g.reducer = std::make_unique<ZeroGradReducer>(dp, options_.overlap_grad_reduce,
                                                  options_.non_finite_watch);
  }
  for (Parameter* p : params) {
    any_deferred = any_deferred || !p->value.defined();  // built with deferred storage
    add_parameter(p, group);
  }
  g.end = slots_.size();
  // Deferred parameters of stages 0–2 hold only this rank's initialised slice (or nothing, in
  // 16 bits): the masters, published, fill every rank's full parameters. Collective over dp.
  if (any_deferred && stage <= 2) publish_group(g);
}

void ZeroSharding::add_parameter(Parameter* p, std::size_t group) {
  const int stage = options_.stage;
  const DType dtype = options_.compute_dtype;
  const bool low = dtype != DType::f32;
  const ProcessGroup& dp = groups_[group].ranks;
  const auto initial_values = [this](const Parameter& q, std::int64_t begin, std::int64_t end,
                                     float* out) {
    if (options_.initial_values) {
      options_.initial_values(q, begin, end, out);
    } else {
      initialize_range(q, options_.seed, begin, end, out);
    }
  };
  const bool deferred = !p->value.defined();  // built with deferred storage
  MT_CHECK(deferred || p->value.dtype() == DType::f32, "{}: ZeRO takes over fp32 parameters",
           p->name);
  Slot s{.shape = p->local_shape(),
         .numel = 0,
         .slice = 0,
         .refs = 0,
         .units = 0,
         .backward_left = 0,
         .group = group};
  s.numel = shape_numel(s.shape);
  s.slice = zero_slice(stage, s.numel, dp.size(), low);
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

void ZeroSharding::plan_units(const std::vector<ParameterList>& units) {
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
  MT_CHECK(options_.stage < 2 || covered == slots_.size(), "{} of {} parameters in no unit",
           slots_.size() - covered, slots_.size());
  // Stages 0 and 1: a unit's gradients are final after its backward of the last micro-batch.
  const auto passes = [this, m = options_.microbatches](const Parameter& p) {
    return slots_[index_.at(&p)].units * m;
  };
  for (Group& g : groups_) {
    if (g.buckets && options_.overlap_grad_reduce) g.buckets->enable_overlap(passes);
    if (options_.stage != 1) continue;
    std::vector<SlicedGrad> all;
    for (std::size_t i = g.begin; i < g.end; ++i) all.push_back(sliced(*shards_[i].param));
    g.reducer->plan_buckets(std::move(all), options_.bucket_bytes, passes);
  }
}

const ParameterList* ZeroSharding::part(const ParameterList* unit, std::size_t i) {
  if (unit == nullptr) return nullptr;
  auto [it, added] = parts_.try_emplace({unit, i});
  if (added) it->second = in_group(*unit, groups_[i].kind);
  return it->second.empty() ? nullptr : &it->second;
}

SlicedGrad ZeroSharding::sliced(const Parameter& p) {
  const std::size_t i = index_.at(&p);
  return {
      .param = &p, .numel = slots_[i].numel, .slice = slots_[i].slice, .owned = shards_[i].grad};
}

std::size_t ZeroSharding::buckets_posted_in_backward() const noexcept {
  std::size_t n = 0;
  for (const Group& g : groups_) {
    if (g.buckets) n += g.buckets->posted_in_backward();
    if (g.reducer) n += g.reducer->posted_in_backward();
  }
  return n;
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

void ZeroSharding::unpack_values(const Group& g, const ParameterList& params, const Tensor& recv) {
  const std::size_t elem = dtype_size(options_.compute_dtype);
  const auto* at = reinterpret_cast<const std::byte*>(recv.f32());
  for (int q = 0; q < g.ranks.size(); ++q) {
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
  for (Group& g : groups_) {
    reduce_group(g);
    if (g.rescale == 1.0f) continue;  // from the mean over its ranks to the mean over mean_over
    for (std::size_t i = g.begin; i < g.end; ++i) {
      kernels::scale_inplace(shards_[i].grad.f32(), g.rescale, shards_[i].grad.numel());
    }
  }
}

void ZeroSharding::reduce_group(Group& g) {
  if (options_.stage == 0) {
    g.buckets->all_reduce_mean();
    return;
  }
  // Stage 1: the buckets backward did not post; stages 2–3 posted every unit's in its hook.
  if (options_.stage == 1) g.reducer->post_remaining_buckets();
  g.reducer->finish_step();
}

void ZeroSharding::publish_parameters() {
  for (Group& g : groups_) publish_group(g);
}

void ZeroSharding::publish_group(Group& g) {
  const DType dtype = options_.compute_dtype;
  if (options_.stage == 0) {
    if (dtype == DType::f32) return;  // the master is the parameter
    for (std::size_t i = g.begin; i < g.end; ++i) {
      OptimizerShard& shard = shards_[i];
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
    Tensor& send = g.reducer->idle_buffer(1, words);
    Tensor& recv = g.reducer->idle_buffer(0, words * g.ranks.size());
    pack_masters(bucket, send);
    g.ranks.all_gather({send.f32(), static_cast<std::size_t>(words)},
                       {recv.f32(), static_cast<std::size_t>(words * g.ranks.size())});
    unpack_values(g, bucket, recv);
    bucket.clear();
    bytes = 0;
  };
  for (std::size_t i = g.begin; i < g.end; ++i) {
    const OptimizerShard& shard = shards_[i];
    const std::int64_t b =
        slots_[i].slice * g.ranks.size() * static_cast<std::int64_t>(dtype_size(dtype));
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
  return gather_slices(group_for(p).ranks, shard.master, s.slice, s.shape);
}

Tensor ZeroSharding::gather_grad(const Parameter& p) {
  const Slot& s = slot(p);
  const OptimizerShard& shard = shards_[index_.at(&p)];
  if (options_.stage == 0) return shard.grad.clone(MemCategory::other).reshape(s.shape);
  return gather_slices(group_for(p).ranks, shard.grad, s.slice, s.shape);
}

void ZeroSharding::post_gather(Group& g, const ParameterList& unit, PendingGather& out) {
  const DType dtype = options_.compute_dtype;
  const std::int64_t total = slice_total(unit);
  const std::int64_t words = (total * static_cast<std::int64_t>(dtype_size(dtype)) + 3) / 4;
  out.unit = &unit;
  out.send = Tensor::empty({words}, MemCategory::comm);
  out.recv = Tensor::empty({words * g.ranks.size()}, MemCategory::comm);
  pack_masters(unit, out.send);
  out.request = g.ranks.iall_gather(out.send.span_f32(), out.recv.span_f32());
}

void ZeroSharding::gather_unit(Group& g, const ParameterList& unit) {
  std::optional<PendingGather>& pending = g.pending;
  if (pending && pending->unit != &unit) {
    pending->request->wait();  // a prefetch the model did not use (order changed): dropped
    pending.reset();
  }
  if (!pending) post_gather(g, unit, pending.emplace());
  pending->request->wait();
  for (Parameter* p : unit) {
    Slot& s = slot(*p);
    if (s.refs++ == 0) p->value = Tensor::empty(s.shape, MemCategory::comm, options_.compute_dtype);
  }
  unpack_values(g, unit, pending->recv);  // a value already held is rewritten with equal bytes
  pending.reset();
}

void ZeroSharding::release_unit_values(const ParameterList& unit) {
  for (Parameter* p : unit) {
    Slot& s = slot(*p);
    MT_CHECK(s.refs > 0, "{}: released more often than gathered", p->name);
    if (--s.refs == 0) p->value = Tensor();
  }
}

void ZeroSharding::before_forward(const ParameterList& unit, const ParameterList* next) {
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    if (const ParameterList* u = part(&unit, i))
      group_before_forward(groups_[i], *u, part(next, i));
  }
}

void ZeroSharding::after_forward(const ParameterList& unit) {
  if (options_.stage < 3) return;
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    if (const ParameterList* u = part(&unit, i)) release_unit_values(*u);
  }
}

void ZeroSharding::before_backward(const ParameterList& unit, const ParameterList* next) {
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    if (const ParameterList* u = part(&unit, i))
      group_before_backward(groups_[i], *u, part(next, i));
  }
}

void ZeroSharding::after_backward(const ParameterList& unit) {
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    if (const ParameterList* u = part(&unit, i)) group_after_backward(groups_[i], *u);
  }
}

// A group's hooks see only the units that hold some of its parameters, and as `next` the next
// unit that the model names if it holds some (else no prefetch: a gather on demand).
void ZeroSharding::group_before_forward(Group& g, const ParameterList& unit,
                                        const ParameterList* next) {
  if (g.reducer && options_.overlap_grad_reduce) {
    const ScopeSeconds timed(hook_seconds_);
    g.reducer->progress();  // the last micro-batch's tail, under the next one's forward
  }
  if (options_.stage < 3) return;
  gather_unit(g, unit);
  if (next) post_gather(g, *next, g.pending.emplace());
}

void ZeroSharding::group_before_backward(Group& g, const ParameterList& unit,
                                         const ParameterList* next) {
  if (options_.overlap_grad_reduce) {
    const ScopeSeconds timed(hook_seconds_);
    if (g.buckets) g.buckets->progress();  // MPI moves posted buckets only inside MPI calls
    if (g.reducer) g.reducer->progress();  // and our rings' steps only inside test()
  }
  if (options_.stage < 2) return;
  for (Parameter* p : unit) {
    // The unit's full gradient exists only during its backward: a communication buffer.
    if (!p->grad.defined()) p->grad = Tensor::zeros(slot(*p).shape, MemCategory::comm);
  }
  if (options_.stage < 3) return;
  gather_unit(g, unit);
  if (next) post_gather(g, *next, g.pending.emplace());
}

void ZeroSharding::group_after_backward(Group& g, const ParameterList& unit) {
  const ScopeSeconds timed(hook_seconds_);
  if (g.buckets && g.buckets->overlap()) {
    for (const Parameter* p : unit) g.buckets->grad_ready(*p);
    g.buckets->progress();
  }
  if (options_.stage == 1 && options_.overlap_grad_reduce) {
    for (const Parameter* p : unit) g.reducer->grad_ready(*p);
    g.reducer->progress();
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
    g.reducer->post_unit(std::move(grads));  // copies the gradients: they may go
  }
  for (Parameter* p : complete) p->grad = Tensor();
  g.reducer->progress();
  if (options_.stage == 3) release_unit_values(unit);
}

}  // namespace meshtrain
