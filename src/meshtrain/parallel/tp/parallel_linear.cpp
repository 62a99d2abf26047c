#include "meshtrain/parallel/tp/parallel_linear.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/autocast.h"
#include "meshtrain/layers/weight_grad_queue.h"

namespace meshtrain {

ColumnParallelLinear::ColumnParallelLinear(std::vector<ColumnWeight> weights,
                                           const PlacementTable& records,
                                           const TensorParallel& tp, ParameterStorage storage)
    : tp_(tp) {
  const int r = tp.group.rank(), n = tp.group.size();
  MT_CHECK(!weights.empty(), "a column-parallel linear of no weights");
  in_ = records.at(weights.front().prefix + ".weight").shape.at(1);
  for (const ColumnWeight& w : weights) {
    const ParamPlacement& weight = records.at(w.prefix + ".weight");
    const std::int64_t out = weight.shape.at(0), parts = weight.on(Axis::tp).parts;
    MT_CHECK(weight.shape.at(1) == in_, "{}: {} input features, {} has {}", weight.name,
             weight.shape.at(1), weights.front().prefix, in_);
    MT_CHECK(out % (parts * n) == 0,
             "{}: {} output features in {} parts cannot be split over {} ranks of {}", w.prefix,
             out, parts, n, tp.group.name());
    Shard s{.out_local = out / n,
            .weight = Parameter(weight, r, n, InitKind::normal, w.init_std, storage),
            .bias = std::nullopt};
    if (const ParamPlacement* bias = records.find(w.prefix + ".bias")) {
      s.bias.emplace(*bias, r, n, InitKind::zeros, 0.0f, storage);
    }
    shards_.push_back(std::move(s));
  }
}

std::vector<Tensor> ColumnParallelLinear::forward(const Tensor& x, const MicroBatchContext& ctx) {
  return forward(x, true, ctx);
}

std::vector<Tensor> ColumnParallelLinear::forward(const Tensor& x, bool add_bias,
                                                  const MicroBatchContext& ctx) {
  const Tensor x_full = EnterTpRegion::forward(x, tp_);
  MT_CHECK(x_full.ndim() == 2 && x_full.dim(1) == in_, "{}: input {} expected [tokens, {}]",
           shards_.front().weight.name, to_string(x_full.shape()), in_);
  // One rounded input serves every weight: they share a dtype (the trainer casts them alike).
  Tensor& kept = saved_.at(ctx.slot).x_full;
  kept = matmul_input(x_full, shards_.front().weight);
  const std::int64_t tokens = x_full.dim(0);
  std::vector<Tensor> ys;
  for (Shard& s : shards_) {
    MT_CHECK(s.weight.value.dtype() == kept.dtype(), "{} is {}, {} is {}", s.weight.name,
             to_string(s.weight.value.dtype()), shards_.front().weight.name,
             to_string(kept.dtype()));
    Tensor y = Tensor::empty({tokens, s.out_local}, MemCategory::activations);
    autocast_linear_forward(kept, s.weight, s.bias && add_bias ? &*s.bias : nullptr, y);
    ys.push_back(std::move(y));
  }
  return ys;
}

Tensor ColumnParallelLinear::backward(std::span<const Tensor> dys, const MicroBatchContext& ctx) {
  return backward(dys, true, ctx);
}

Tensor ColumnParallelLinear::backward(std::span<const Tensor> dys, bool bias_grads,
                                      const MicroBatchContext& ctx) {
  MT_CHECK(dys.size() == shards_.size(), "{}: {} gradients for {} weights",
           shards_.front().weight.name, dys.size(), shards_.size());
  Tensor x_full = saved_.take(ctx.slot, shards_.front().weight.name).x_full;
  const std::int64_t tokens = x_full.dim(0);
  Tensor dx = Tensor::empty(x_full.shape(), MemCategory::activations);
  Tensor dx_part;
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    Shard& s = shards_[i];
    MT_CHECK(dys[i].ndim() == 2 && dys[i].dim(0) == tokens && dys[i].dim(1) == s.out_local,
             "{}: grad {} expected [{}, {}]", s.weight.name, to_string(dys[i].shape()), tokens,
             s.out_local);
    // linear_backward overwrites dx: the first weight writes it, the others add theirs.
    if (i == 1) dx_part = Tensor::empty(x_full.shape(), MemCategory::activations);
    float* out = i == 0 ? dx.f32() : dx_part.f32();
    linear_backward_or_defer(x_full, s.weight, dys[i], out,
                             s.bias && bias_grads ? s.bias->grad.f32() : nullptr,
                             {tokens, in_, s.out_local}, ctx);
    if (i > 0) kernels::add_inplace(dx.f32(), dx_part.f32(), dx.numel());
  }
  x_full = dx_part = Tensor();  // freed before the region's backward, unless a W task keeps it
  return EnterTpRegion::backward(dx, tp_);
}

ParameterList ColumnParallelLinear::parameters() {
  ParameterList out;
  for (Shard& s : shards_) {
    out.push_back(&s.weight);
    if (s.bias) out.push_back(&*s.bias);
  }
  return out;
}

RowParallelLinear::RowParallelLinear(const std::string& prefix, const PlacementTable& records,
                                     float init_std, const TensorParallel& tp,
                                     ParameterStorage storage)
    : tp_(tp),
      weight_(records.at(prefix + ".weight"), tp.group.rank(), tp.group.size(), InitKind::normal,
              init_std, storage) {
  const std::int64_t in_features = weight_.shard.logical_shape.at(1);
  MT_CHECK(in_features % tp.group.size() == 0,
           "{}: {} input features cannot be split over {} ranks of {}", prefix, in_features,
           tp.group.size(), tp.group.name());
  in_local_ = weight_.local_shape().at(1);
  out_ = weight_.shard.logical_shape.at(0);
  if (const ParamPlacement* bias = records.find(prefix + ".bias")) {
    bias_.emplace(*bias, tp.group.rank(), tp.group.size(), InitKind::zeros, 0.0f, storage);
  }
}

void RowParallelLinear::keep_input(const Tensor& x, const MicroBatchContext& ctx) {
  // As forward keeps it (16-bit under mixed precision).
  saved_.at(ctx.slot).x = matmul_input(x, weight_);
}

Tensor RowParallelLinear::forward(const Tensor& x, const MicroBatchContext& ctx) {
  MT_CHECK(x.ndim() == 2 && x.dim(1) == in_local_, "{}: input {} expected [tokens, {}]",
           weight_.name, to_string(x.shape()), in_local_);
  Tensor& kept = saved_.at(ctx.slot).x;
  kept = matmul_input(x, weight_);
  Tensor partial = Tensor::empty({x.dim(0), out_}, MemCategory::activations);
  autocast_linear_forward(kept, weight_, nullptr, partial);
  Tensor y = ExitTpRegion::forward(partial, tp_);
  if (bias_) {  // once, after the sum: adding it on every rank before would count it tp times
    const Tensor b = value_f32(*bias_);
    for (std::int64_t t = 0; t < y.dim(0); ++t) {
      kernels::add_inplace(y.f32() + t * out_, b.f32(), out_);
    }
  }
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  // Freed on return, unless a W task keeps it.
  const Tensor x = saved_.take(ctx.slot, weight_.name).x;
  if (bias_) {  // from dY as this rank holds it (all tokens, or its own under SP)
    for (std::int64_t t = 0; t < dy.dim(0); ++t) {
      kernels::add_inplace(bias_->grad.f32(), dy.f32() + t * out_, out_);
    }
  }
  const Tensor dy_full = ExitTpRegion::backward(dy, tp_);
  MT_CHECK(dy_full.dim(0) == x.dim(0) && dy_full.dim(1) == out_, "{}: grad {} expected [{}, {}]",
           weight_.name, to_string(dy_full.shape()), x.dim(0), out_);
  Tensor dx = Tensor::empty(x.shape(), MemCategory::activations);
  linear_backward_or_defer(x, weight_, dy_full, dx.f32(), nullptr, {x.dim(0), in_local_, out_},
                           ctx);
  return dx;
}

ParameterList RowParallelLinear::parameters() {
  ParameterList out{&weight_};
  if (bias_) out.push_back(&*bias_);
  return out;
}

}  // namespace meshtrain
