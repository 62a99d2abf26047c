#include "meshtrain/layers/parameter.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

namespace meshtrain {
namespace {

Shape checked_local_shape(const ShardSlice& s) {
  const auto d = static_cast<std::size_t>(s.dim);
  MT_CHECK(
      s.dim >= 0 && d < s.logical_shape.size() && s.parts >= 1 && s.logical_shape[d] % s.parts == 0,
      "shard of dim {} in {} parts does not fit {}", s.dim, s.parts, to_string(s.logical_shape));
  const std::int64_t block = s.logical_shape[d] / s.parts;
  MT_CHECK(s.offset >= 0 && s.length >= 0 && s.length <= s.stride &&
               (s.length == 0 || s.offset + s.length <= block),
           "shard [{}, +{}) (stride {}) of dim {} outside {}", s.offset, s.length, s.stride, s.dim,
           to_string(s.logical_shape));
  Shape shape = s.logical_shape;
  shape[d] = s.parts * s.stride;
  return shape;
}

}  // namespace

Parameter::Parameter(std::string name_, Shape shape, InitKind init_, float init_std_,
                     ParameterStorage storage)
    : Parameter(std::move(name_), whole(shape), init_, init_std_, storage) {}

Parameter::Parameter(std::string name_, ShardSlice shard_, InitKind init_, float init_std_,
                     ParameterStorage storage)
    : name(std::move(name_)),
      init(init_),
      init_std(init_std_),
      weight_decay(shard_.logical_shape.size() >= 2),
      shard(std::move(shard_)) {
  const Shape shape = checked_local_shape(shard);
  placement.name = name;
  placement.shape = shard.logical_shape;
  if (!(shard == whole(shard.logical_shape))) {
    placement.axes[static_cast<std::size_t>(Axis::tp)] = {
        .kind = PlacementKind::shard, .dim = shard.dim, .parts = shard.parts};
  }
  if (storage == ParameterStorage::deferred) return;
  value = Tensor::zeros(shape, MemCategory::params);
  grad = Tensor::zeros(shape, MemCategory::grads);
}

Parameter::Parameter(const ParamPlacement& record, int tp_rank, int tp_size, InitKind init_,
                     float init_std_, ParameterStorage storage)
    : Parameter(record.name, record.tp_slice(tp_rank, tp_size), init_, init_std_, storage) {
  placement = record;
}

Shape Parameter::local_shape() const { return checked_local_shape(shard); }

bool Parameter::is_sharded() const {
  if (shard.logical_shape.empty()) return false;
  return shard.length * shard.parts < shard.logical_shape[static_cast<std::size_t>(shard.dim)];
}

std::int64_t Parameter::logical_numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shard.logical_shape) n *= d;
  return n;
}

void initialize(Parameter& p, std::uint64_t seed) {
  if (!p.value.defined()) return;  // storage deferred: initialize_range fills the owner's slice
  initialize_range(p, seed, 0, p.value.numel(), p.value.f32());
}

void initialize_range(const Parameter& p, std::uint64_t seed, std::int64_t begin, std::int64_t end,
                      float* out) {
  std::fill(out, out + (end - begin), 0.0f);  // padding, and everything no run covers
  const std::uint64_t stream = stream_of(p.name);
  for (const ShardRun& run : runs_of(p.shard)) {
    const std::int64_t from = std::max(begin, run.local);
    const std::int64_t to = std::min(end, run.local + run.count);
    if (from >= to) continue;
    std::span<float> dst(out + (from - begin), static_cast<std::size_t>(to - from));
    switch (p.init) {
      case InitKind::normal:
        fill_normal(dst, seed, stream, static_cast<std::uint64_t>(run.logical + (from - run.local)),
                    0.0f, p.init_std);
        break;
      case InitKind::zeros:
        break;
      case InitKind::ones:
        std::fill(dst.begin(), dst.end(), 1.0f);
        break;
    }
  }
}

void copy_range_from_logical(const Parameter& p, const Tensor& logical, std::int64_t begin,
                             std::int64_t end, float* out) {
  MT_CHECK(logical.dtype() == DType::f32 && logical.shape() == p.shard.logical_shape,
           "{}: logical tensor of shape {}, the parameter's is {}", p.name,
           to_string(logical.shape()), to_string(p.shard.logical_shape));
  std::fill(out, out + (end - begin), 0.0f);  // padding
  const float* src = logical.f32();
  for (const ShardRun& run : runs_of(p.shard)) {
    const std::int64_t from = std::max(begin, run.local);
    const std::int64_t to = std::min(end, run.local + run.count);
    if (from >= to) continue;
    std::copy(src + run.logical + (from - run.local), src + run.logical + (to - run.local),
              out + (from - begin));
  }
}

OptimizerShards whole_shards(const ParameterList& params) {
  OptimizerShards shards;
  for (Parameter* p : params) {
    const std::int64_t n = p->value.numel();
    shards.push_back({.param = p,
                      .begin = 0,
                      .end = n,
                      .master = p->value.reshape({n}),
                      .grad = p->grad.reshape({n})});
  }
  return shards;
}

}  // namespace meshtrain
