#include "meshtrain/parallel/tp/gather.h"

#include <cstring>

#include "meshtrain/core/error.h"

namespace meshtrain {

Tensor gather_logical(const Parameter& p, const Tensor& which, ProcessGroup& tp) {
  Tensor out = Tensor::empty(p.shard.logical_shape, MemCategory::other);
  if (!p.is_sharded()) {
    std::memcpy(out.f32(), which.f32(), static_cast<std::size_t>(out.bytes()));
    return out;
  }
  MT_CHECK(p.shard == p.placement.tp_slice(tp.rank(), tp.size()),
           "{}: shard is not its placement's slice over {}", p.name, tp.name());
  const std::int64_t local = which.numel();
  Tensor all = Tensor::empty({tp.size() * local}, MemCategory::other);
  tp.all_gather(which.span_f32(), all.span_f32());
  for (int r = 0; r < tp.size(); ++r) {
    for (const ShardRun& run : runs_of(p.placement.tp_slice(r, tp.size()))) {
      std::memcpy(out.f32() + run.logical, all.f32() + r * local + run.local,
                  static_cast<std::size_t>(run.count) * sizeof(float));
    }
  }
  return out;
}

}  // namespace meshtrain
