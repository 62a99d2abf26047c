#include "meshtrain/layers/layer_norm.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

LayerNorm::LayerNorm(const std::string& prefix, std::int64_t features, bool bias)
    : features_(features), weight_(prefix + ".weight", {features}, InitKind::ones) {
  if (bias) bias_.emplace(prefix + ".bias", Shape{features}, InitKind::zeros);
}

Tensor LayerNorm::forward(const Tensor& x) {
  MT_CHECK(x.ndim() == 2 && x.dim(1) == features_, "{}: input {} expected [tokens, {}]",
           weight_.name, to_string(x.shape()), features_);
  const std::int64_t rows = x.dim(0);
  x_ = x;
  mean_ = Tensor::empty({rows}, MemCategory::activations);
  rstd_ = Tensor::empty({rows}, MemCategory::activations);
  Tensor y = Tensor::empty({rows, features_}, MemCategory::activations);
  kernels::layernorm_forward(x.f32(), weight_.value.f32(), bias_ ? bias_->value.f32() : nullptr,
                             y.f32(), mean_.f32(), rstd_.f32(), rows, features_, kEps);
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

}  // namespace meshtrain
