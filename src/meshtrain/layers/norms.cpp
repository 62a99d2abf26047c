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
}  // namespace

LayerNorm::LayerNorm(const std::string& prefix, std::int64_t features, bool bias, float eps)
    : features_(features), eps_(eps), weight_(prefix + ".weight", Shape{features}, InitKind::ones) {
  if (bias) bias_.emplace(prefix + ".bias", Shape{features}, InitKind::zeros);
}

Tensor LayerNorm::forward(const Tensor& x, const SequenceBatch& /*batch*/) {
  check_input(x, features_, weight_.name);
  const std::int64_t rows = x.dim(0);
  State& s = *saved_;
  s.x = x;
  s.mean = Tensor::empty({rows}, MemCategory::activations);
  s.rstd = Tensor::empty({rows}, MemCategory::activations);
  Tensor y = Tensor::empty({rows, features_}, MemCategory::activations);
  const Tensor weight = value_f32(weight_);  // widened when 16-bit: the norm runs in f32
  const Tensor bias = bias_ ? value_f32(*bias_) : Tensor();
  kernels::layernorm_forward(x.f32(), weight.f32(), bias_ ? bias.f32() : nullptr, y.f32(),
                             s.mean.f32(), s.rstd.f32(), rows, features_, eps_);
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
  const State s = saved_.take(weight_.name);  // freed on return
  MT_CHECK(dy.shape() == s.x.shape(), "{}: grad {} expected {}", weight_.name,
           to_string(dy.shape()), to_string(s.x.shape()));
  Tensor dx = Tensor::empty(s.x.shape(), MemCategory::activations);
  kernels::layernorm_backward(s.x.f32(), value_f32(weight_).f32(), s.mean.f32(), s.rstd.f32(),
                              dy.f32(), dx.f32(), weight_.grad.f32(),
                              bias_ ? bias_->grad.f32() : nullptr, s.x.dim(0), features_);
  return dx;
}

ParameterList LayerNorm::parameters() {
  ParameterList out{&weight_};
  if (bias_) out.push_back(&*bias_);
  return out;
}

RmsNorm::RmsNorm(const std::string& prefix, std::int64_t features, float eps)
    : features_(features),
      eps_(eps),
      weight_(prefix + ".weight", Shape{features}, InitKind::ones) {}

Tensor RmsNorm::forward(const Tensor& x, const SequenceBatch& /*batch*/) {
  check_input(x, features_, weight_.name);
  State& s = *saved_;
  s.x = x;
  s.rstd = Tensor::empty({x.dim(0)}, MemCategory::activations);
  Tensor y = Tensor::empty(x.shape(), MemCategory::activations);
  kernels::rmsnorm_forward(x.f32(), value_f32(weight_).f32(), y.f32(), s.rstd.f32(), x.dim(0),
                           features_, eps_);
  return y;
}

Tensor RmsNorm::backward(const Tensor& dy) {
  const State s = saved_.take(weight_.name);  // freed on return
  MT_CHECK(dy.shape() == s.x.shape(), "{}: grad {} expected {}", weight_.name,
           to_string(dy.shape()), to_string(s.x.shape()));
  Tensor dx = Tensor::empty(s.x.shape(), MemCategory::activations);
  kernels::rmsnorm_backward(s.x.f32(), value_f32(weight_).f32(), s.rstd.f32(), dy.f32(), dx.f32(),
                            weight_.grad.f32(), s.x.dim(0), features_);
  return dx;
}

ParameterList RmsNorm::parameters() { return {&weight_}; }

}  // namespace meshtrain
