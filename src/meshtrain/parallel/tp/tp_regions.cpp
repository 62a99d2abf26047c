#include "meshtrain/parallel/tp/tp_regions.h"

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// [tokens/tp, h] → [tokens, h]: rank r's rows land at [r·tokens/tp, (r+1)·tokens/tp).
Tensor all_gather_rows(const Tensor& x, ProcessGroup& tp) {
  if (tp.size() == 1) return x;
  Shape shape = x.shape();
  shape[0] *= tp.size();
  Tensor out = Tensor::empty(shape, MemCategory::activations);
  tp.all_gather(x.span_f32(), out.span_f32());
  return out;
}

// [tokens, h] → [tokens/tp, h]: rank r keeps the sum over ranks of rows [r·tokens/tp, ...).
Tensor reduce_scatter_rows(const Tensor& x, ProcessGroup& tp) {
  if (tp.size() == 1) return x;
  MT_CHECK(x.dim(0) % tp.size() == 0, "{} rows cannot be split over {} ranks of {}", x.dim(0),
           tp.size(), tp.name());
  Shape shape = x.shape();
  shape[0] /= tp.size();
  Tensor out = Tensor::empty(shape, MemCategory::activations);
  tp.reduce_scatter_sum(x.span_f32(), out.span_f32());
  return out;
}

Tensor all_reduce_in_place(const Tensor& x, ProcessGroup& tp) {
  Tensor y = x;  // shares storage: the caller's tensor is reduced in place
  tp.all_reduce_sum(y.span_f32());
  return y;
}

}  // namespace

Tensor CopyToTpRegion::forward(const Tensor& x, ProcessGroup& /*tp*/) { return x; }
Tensor CopyToTpRegion::backward(const Tensor& dx, ProcessGroup& tp) {
  return all_reduce_in_place(dx, tp);
}

Tensor ReduceFromTpRegion::forward(const Tensor& y, ProcessGroup& tp) {
  return all_reduce_in_place(y, tp);
}
Tensor ReduceFromTpRegion::backward(const Tensor& dy, ProcessGroup& /*tp*/) { return dy; }

Tensor GatherFromSequenceRegion::forward(const Tensor& x, ProcessGroup& tp) {
  return all_gather_rows(x, tp);
}
Tensor GatherFromSequenceRegion::backward(const Tensor& dx, ProcessGroup& tp) {
  return reduce_scatter_rows(dx, tp);
}

Tensor ScatterToSequenceRegion::forward(const Tensor& y, ProcessGroup& tp) {
  return reduce_scatter_rows(y, tp);
}
Tensor ScatterToSequenceRegion::backward(const Tensor& dy, ProcessGroup& tp) {
  return all_gather_rows(dy, tp);
}

Tensor EnterTpRegion::forward(const Tensor& x, const TensorParallel& tp) {
  return tp.sequence_parallel ? GatherFromSequenceRegion::forward(x, tp.group)
                              : CopyToTpRegion::forward(x, tp.group);
}
Tensor EnterTpRegion::backward(const Tensor& dx, const TensorParallel& tp) {
  return tp.sequence_parallel ? GatherFromSequenceRegion::backward(dx, tp.group)
                              : CopyToTpRegion::backward(dx, tp.group);
}

Tensor ExitTpRegion::forward(const Tensor& y, const TensorParallel& tp) {
  return tp.sequence_parallel ? ScatterToSequenceRegion::forward(y, tp.group)
                              : ReduceFromTpRegion::forward(y, tp.group);
}
Tensor ExitTpRegion::backward(const Tensor& dy, const TensorParallel& tp) {
  return tp.sequence_parallel ? ScatterToSequenceRegion::backward(dy, tp.group)
                              : ReduceFromTpRegion::backward(dy, tp.group);
}

}  // namespace meshtrain
