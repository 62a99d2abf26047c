#include "meshtrain/layers/parameter.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

namespace meshtrain {

namespace {
Shape local_shape(const ShardSlice& shard, std::int64_t local_size) {
  MT_CHECK(
      shard.dim >= 0 && shard.dim < static_cast<int>(shard.logical_shape.size()) &&
          shard.offset >= 0 && local_size >= 0 &&
          shard.offset + local_size <= shard.logical_shape[static_cast<std::size_t>(shard.dim)],
      "shard [{}, +{}) of dim {} outside {}", shard.offset, local_size, shard.dim,
      to_string(shard.logical_shape));
  Shape shape = shard.logical_shape;
  shape[static_cast<std::size_t>(shard.dim)] = local_size;
  return shape;
}
}  // namespace

Parameter::Parameter(std::string name_, Shape shape, InitKind init_, float init_std_)
    : Parameter(std::move(name_), ShardSlice{0, 0, shape}, shape.empty() ? 1 : shape[0], init_,
                init_std_) {}

Parameter::Parameter(std::string name_, ShardSlice shard_, std::int64_t local_size, InitKind init_,
                     float init_std_)
    : name(std::move(name_)),
      value(Tensor::empty(local_shape(shard_, local_size), MemCategory::params)),
      grad(Tensor::zeros(value.shape(), MemCategory::grads)),
      init(init_),
      init_std(init_std_),
      weight_decay(shard_.logical_shape.size() >= 2),
      shard(std::move(shard_)) {}

void initialize(Parameter& p, std::uint64_t seed) {
  switch (p.init) {
    case InitKind::normal: {
      // Elements of the logical tensor are numbered row-major; the shard holds, for every
      // index of the dimensions before `dim`, one contiguous run of `run` elements starting at
      // `offset` within a logical block of `block` elements.
      const Shape& logical = p.shard.logical_shape;
      const auto d = static_cast<std::size_t>(p.shard.dim);
      std::int64_t inner = 1;  // elements per index of dimension `dim`
      for (std::size_t i = d + 1; i < logical.size(); ++i) inner *= logical[i];
      const std::int64_t block = logical[d] * inner;
      const std::int64_t run = p.value.shape()[d] * inner;
      const std::int64_t outer = p.value.numel() / std::max<std::int64_t>(run, 1);
      const std::uint64_t stream = stream_of(p.name);
      for (std::int64_t o = 0; o < outer; ++o) {
        fill_normal(p.value.span_f32().subspan(static_cast<std::size_t>(o * run),
                                               static_cast<std::size_t>(run)),
                    seed, stream, static_cast<std::uint64_t>(o * block + p.shard.offset * inner),
                    0.0f, p.init_std);
      }
      break;
    }
    case InitKind::zeros:
      p.value.fill(0.0f);
      break;
    case InitKind::ones:
      p.value.fill(1.0f);
      break;
  }
}

}  // namespace meshtrain
