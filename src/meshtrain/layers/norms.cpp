#include "meshtrain/layers/norms.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"

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
  x_ = x;
  mean_ = Tensor::empty({rows}, MemCategory::activations);
  rstd_ = Tensor::empty({rows}, MemCategory::activations);
  Tensor y = Tensor::empty({rows, features_}, MemCategory::activations);
  kernels::layernorm_forward(x.f32(), weight_.value.f32(), bias_ ? bias_->value.f32() : nullptr,
                             y.f32(), mean_.f32(), rstd_.f32(), rows, features_, eps_);
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
  MT_CHECK(dy.shape() == x_.shape(), "{}: grad {} expected {}", weight_.name, to_string(dy.shape()),
           to_string(x_.shape()));
  Tensor dx = Tensor::empty(x_.shape(), MemCategory::activations);
  kernels::layernorm_backward(x_.f32(), weight_.value.f32(), mean_.f32(), rstd_.f32(), dy.f32(),
                              dx.f32(), weight_.grad.f32(), bias_ ? bias_->grad.f32() : nullptr,
                              x_.dim(0), features_);
  x_ = mean_ = rstd_ = Tensor();
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
  x_ = x;
  rstd_ = Tensor::empty({x.dim(0)}, MemCategory::activations);
  Tensor y = Tensor::empty(x.shape(), MemCategory::activations);
  kernels::rmsnorm_forward(x.f32(), weight_.value.f32(), y.f32(), rstd_.f32(), x.dim(0), features_,
                           eps_);
  return y;
}

Tensor RmsNorm::backward(const Tensor& dy) {
  MT_CHECK(dy.shape() == x_.shape(), "{}: grad {} expected {}", weight_.name, to_string(dy.shape()),
           to_string(x_.shape()));
  Tensor dx = Tensor::empty(x_.shape(), MemCategory::activations);
  kernels::rmsnorm_backward(x_.f32(), weight_.value.f32(), rstd_.f32(), dy.f32(), dx.f32(),
                            weight_.grad.f32(), x_.dim(0), features_);
  x_ = rstd_ = Tensor();
  return dx;
}

ParameterList RmsNorm::parameters() { return {&weight_}; }

}  // namespace meshtrain
