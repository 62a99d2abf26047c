#include "meshtrain/layers/norms.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/autocast.h"

namespace meshtrain {
namespace {
void check_input(const Tensor& x, std::int64_t features, const std::string& name) {
  MT_CHECK(x.ndim() == 2 && x.dim(1) == features, "{}: input {} expected [tokens, {}]", name,
           to_string(x.shape()), features);
}

void check_same(const Tensor& a, const Tensor& b, const std::string& name, const char* what) {
  MT_CHECK(a.shape() == b.shape(), "{}: {} {} expected {}", name, what, to_string(a.shape()),
           to_string(b.shape()));
}
// A norm's [C] tensor: replicated over tp, so every rank holds all of it.
Parameter replicated(const ParamPlacement& record, InitKind init, ParameterStorage storage) {
  MT_CHECK(record.shape.size() == 1 && !record.sharded_over_tp(),
           "{}: a norm's tensor is [C] replicated over tp, not {} {}", record.name,
           to_string(record.shape), to_string(record.on(Axis::tp)));
  return Parameter(record, 0, 1, init, 0.0f, storage);
}

}  // namespace

LayerNorm::LayerNorm(const std::string& prefix, const PlacementTable& records, float eps,
                     ParameterStorage storage)
    : eps_(eps), weight_(replicated(records.at(prefix + ".weight"), InitKind::ones, storage)) {
  features_ = weight_.shard.logical_shape.at(0);
  if (const ParamPlacement* bias = records.find(prefix + ".bias")) {
    bias_.emplace(replicated(*bias, InitKind::zeros, storage));
  }
}

Tensor LayerNorm::forward(const Tensor& x, const SequenceBatch& /*batch*/,
                          const MicroBatchContext& ctx) {
  return run_forward(x, nullptr, ctx);
}

Tensor LayerNorm::forward_residual(Tensor& branch, const Tensor& x, const MicroBatchContext& ctx) {
  check_same(branch, x, weight_.name, "residual branch");
  return run_forward(x, &branch, ctx);
}

// branch == nullptr: y = LN(x). Otherwise h = *branch + x is written into *branch and
// y = LN(h) (the kept input is h).
Tensor LayerNorm::run_forward(const Tensor& x, Tensor* branch, const MicroBatchContext& ctx) {
  check_input(x, features_, weight_.name);
  const std::int64_t rows = x.dim(0);
  State& s = saved_.at(ctx.slot);
  s.x = branch != nullptr ? *branch : x;
  s.mean = Tensor::empty({rows}, MemCategory::activations);
  s.rstd = Tensor::empty({rows}, MemCategory::activations);
  Tensor y = Tensor::empty({rows, features_}, MemCategory::activations);
  const Tensor weight = value_f32(weight_);  // widened when 16-bit: the norm runs in f32
  const Tensor bias = bias_ ? value_f32(*bias_) : Tensor();
  const float* b = bias_ ? bias.f32() : nullptr;
  if (branch == nullptr) {
    kernels::layernorm_forward(x.f32(), weight.f32(), b, y.f32(), s.mean.f32(), s.rstd.f32(), rows,
                               features_, eps_);
  } else {
    float* h = branch->f32();
    kernels::residual_layernorm_forward(h, x.f32(), h, weight.f32(), b, y.f32(), s.mean.f32(),
                                        s.rstd.f32(), rows, features_, eps_);
  }
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  return run_backward(dy, nullptr, ctx);
}

Tensor LayerNorm::backward_residual(const Tensor& dy, const Tensor& d_residual,
                                    const MicroBatchContext& ctx) {
  check_same(d_residual, dy, weight_.name, "residual grad");
  return run_backward(dy, &d_residual, ctx);
}

Tensor LayerNorm::run_backward(const Tensor& dy, const Tensor* d_residual,
                               const MicroBatchContext& ctx) {
  const State s = saved_.take(ctx.slot, weight_.name);  // freed on return
  MT_CHECK(dy.shape() == s.x.shape(), "{}: grad {} expected {}", weight_.name,
           to_string(dy.shape()), to_string(s.x.shape()));
  Tensor dx = Tensor::empty(s.x.shape(), MemCategory::activations);
  kernels::layernorm_backward(s.x.f32(), value_f32(weight_).f32(), s.mean.f32(), s.rstd.f32(),
                              dy.f32(), d_residual != nullptr ? d_residual->f32() : nullptr,
                              dx.f32(), weight_.grad.f32(), bias_ ? bias_->grad.f32() : nullptr,
                              s.x.dim(0), features_);
  return dx;
}

ParameterList LayerNorm::parameters() {
  ParameterList out{&weight_};
  if (bias_) out.push_back(&*bias_);
  return out;
}

RmsNorm::RmsNorm(const std::string& prefix, const PlacementTable& records, float eps,
                 ParameterStorage storage)
    : eps_(eps), weight_(replicated(records.at(prefix + ".weight"), InitKind::ones, storage)) {
  features_ = weight_.shard.logical_shape.at(0);
}

Tensor RmsNorm::forward(const Tensor& x, const SequenceBatch& /*batch*/,
                        const MicroBatchContext& ctx) {
  return run_forward(x, nullptr, ctx);
}

Tensor RmsNorm::forward_residual(Tensor& branch, const Tensor& x, const MicroBatchContext& ctx) {
  check_same(branch, x, weight_.name, "residual branch");
  return run_forward(x, &branch, ctx);
}

// As LayerNorm::run_forward: with a branch, h = *branch + x is written into *branch and kept.
Tensor RmsNorm::run_forward(const Tensor& x, Tensor* branch, const MicroBatchContext& ctx) {
  check_input(x, features_, weight_.name);
  State& s = saved_.at(ctx.slot);
  s.x = branch != nullptr ? *branch : x;
  s.rstd = Tensor::empty({x.dim(0)}, MemCategory::activations);
  Tensor y = Tensor::empty(x.shape(), MemCategory::activations);
  const Tensor weight = value_f32(weight_);
  if (branch == nullptr) {
    kernels::rmsnorm_forward(x.f32(), weight.f32(), y.f32(), s.rstd.f32(), x.dim(0), features_,
                             eps_);
  } else {
    float* h = branch->f32();
    kernels::residual_rmsnorm_forward(h, x.f32(), h, weight.f32(), y.f32(), s.rstd.f32(), x.dim(0),
                                      features_, eps_);
  }
  return y;
}

Tensor RmsNorm::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  return run_backward(dy, nullptr, ctx);
}

Tensor RmsNorm::backward_residual(const Tensor& dy, const Tensor& d_residual,
                                  const MicroBatchContext& ctx) {
  check_same(d_residual, dy, weight_.name, "residual grad");
  return run_backward(dy, &d_residual, ctx);
}

Tensor RmsNorm::run_backward(const Tensor& dy, const Tensor* d_residual,
                             const MicroBatchContext& ctx) {
  const State s = saved_.take(ctx.slot, weight_.name);  // freed on return
  MT_CHECK(dy.shape() == s.x.shape(), "{}: grad {} expected {}", weight_.name,
           to_string(dy.shape()), to_string(s.x.shape()));
  Tensor dx = Tensor::empty(s.x.shape(), MemCategory::activations);
  kernels::rmsnorm_backward(s.x.f32(), value_f32(weight_).f32(), s.rstd.f32(), dy.f32(),
                            d_residual != nullptr ? d_residual->f32() : nullptr, dx.f32(),
                            weight_.grad.f32(), s.x.dim(0), features_);
  return dx;
}

ParameterList RmsNorm::parameters() { return {&weight_}; }

}  // namespace meshtrain
