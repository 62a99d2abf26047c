#include "meshtrain/layers/parallel_linear.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/tp_regions.h"

namespace meshtrain {
namespace {

std::int64_t share(std::int64_t n, const ProcessGroup& tp, const std::string& what) {
  MT_CHECK(n % tp.size() == 0, "{}: {} features cannot be split over {} ranks of {}", what, n,
           tp.size(), tp.name());
  return n / tp.size();
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(const std::string& prefix,
                                           const ParallelLinearShape& shape, ProcessGroup& tp)
    : shape_(shape),
      tp_(tp),
      out_local_(share(shape.out_features, tp, prefix)),
      weight_(prefix + ".weight",
              ShardSlice{0, tp.rank() * out_local_, {shape.out_features, shape.in_features}},
              out_local_, InitKind::normal, shape.init_std) {
  if (shape.bias) {
    bias_.emplace(prefix + ".bias", ShardSlice{0, tp.rank() * out_local_, {shape.out_features}},
                  out_local_, InitKind::zeros);
  }
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  x_full_ = shape_.sequence_parallel ? GatherFromSequenceRegion::forward(x, tp_)
                                     : CopyToTpRegion::forward(x, tp_);
  MT_CHECK(x_full_.ndim() == 2 && x_full_.dim(1) == shape_.in_features,
           "{}: input {} expected [tokens, {}]", weight_.name, to_string(x_full_.shape()),
           shape_.in_features);
  Tensor y = Tensor::empty({x_full_.dim(0), out_local_}, MemCategory::activations);
  kernels::linear_forward(x_full_.f32(), weight_.value.f32(), bias_ ? bias_->value.f32() : nullptr,
                          y.f32(), {x_full_.dim(0), shape_.in_features, out_local_});
  return y;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy) {
  MT_CHECK(dy.dim(0) == x_full_.dim(0) && dy.dim(1) == out_local_, "{}: grad {} expected [{}, {}]",
           weight_.name, to_string(dy.shape()), x_full_.dim(0), out_local_);
  Tensor dx = Tensor::empty(x_full_.shape(), MemCategory::activations);
  kernels::linear_backward(x_full_.f32(), weight_.value.f32(), dy.f32(), dx.f32(),
                           weight_.grad.f32(), bias_ ? bias_->grad.f32() : nullptr,
                           {x_full_.dim(0), shape_.in_features, out_local_});
  x_full_ = Tensor();
  return shape_.sequence_parallel ? GatherFromSequenceRegion::backward(dx, tp_)
                                  : CopyToTpRegion::backward(dx, tp_);
}

ParameterList ColumnParallelLinear::parameters() {
  ParameterList out{&weight_};
  if (bias_) out.push_back(&*bias_);
  return out;
}

RowParallelLinear::RowParallelLinear(const std::string& prefix, const ParallelLinearShape& shape,
                                     ProcessGroup& tp)
    : shape_(shape),
      tp_(tp),
      in_local_(share(shape.in_features, tp, prefix)),
      weight_(prefix + ".weight",
              ShardSlice{1, tp.rank() * in_local_, {shape.out_features, shape.in_features}},
              in_local_, InitKind::normal, shape.init_std) {
  if (shape.bias) bias_.emplace(prefix + ".bias", Shape{shape.out_features}, InitKind::zeros);
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  MT_CHECK(x.ndim() == 2 && x.dim(1) == in_local_, "{}: input {} expected [tokens, {}]",
           weight_.name, to_string(x.shape()), in_local_);
  x_ = x;
  Tensor partial = Tensor::empty({x.dim(0), shape_.out_features}, MemCategory::activations);
  kernels::linear_forward(x.f32(), weight_.value.f32(), nullptr, partial.f32(),
                          {x.dim(0), in_local_, shape_.out_features});
  Tensor y = shape_.sequence_parallel ? ScatterToSequenceRegion::forward(partial, tp_)
                                      : ReduceFromTpRegion::forward(partial, tp_);
  if (bias_) {  // once, after the sum: adding it on every rank before would count it tp times
    for (std::int64_t t = 0; t < y.dim(0); ++t) {
      kernels::add_inplace(y.f32() + t * shape_.out_features, bias_->value.f32(),
                           shape_.out_features);
    }
  }
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy) {
  const Tensor dy_full = shape_.sequence_parallel ? ScatterToSequenceRegion::backward(dy, tp_)
                                                  : ReduceFromTpRegion::backward(dy, tp_);
  MT_CHECK(dy_full.dim(0) == x_.dim(0) && dy_full.dim(1) == shape_.out_features,
           "{}: grad {} expected [{}, {}]", weight_.name, to_string(dy_full.shape()), x_.dim(0),
           shape_.out_features);
  Tensor dx = Tensor::empty(x_.shape(), MemCategory::activations);
  kernels::linear_backward(x_.f32(), weight_.value.f32(), dy_full.f32(), dx.f32(),
                           weight_.grad.f32(), bias_ ? bias_->grad.f32() : nullptr,
                           {x_.dim(0), in_local_, shape_.out_features});
  x_ = Tensor();
  return dx;
}

ParameterList RowParallelLinear::parameters() {
  ParameterList out{&weight_};
  if (bias_) out.push_back(&*bias_);
  return out;
}

}  // namespace meshtrain
