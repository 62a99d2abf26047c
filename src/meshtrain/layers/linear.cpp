#include "meshtrain/layers/linear.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

Linear::Linear(const std::string& prefix, std::int64_t in_features, std::int64_t out_features,
               bool bias, float init_std)
    : in_(in_features),
      out_(out_features),
      weight_(prefix + ".weight", {out_features, in_features}, InitKind::normal, init_std) {
  if (bias) bias_.emplace(prefix + ".bias", Shape{out_features}, InitKind::zeros);
}

Tensor Linear::forward(const Tensor& x) {
  MT_CHECK(x.ndim() == 2 && x.dim(1) == in_, "{}: input {} expected [tokens, {}]", weight_.name,
           to_string(x.shape()), in_);
  x_ = x;
  Tensor y = Tensor::empty({x.dim(0), out_}, MemCategory::activations);
  kernels::linear_forward(x.f32(), weight_.value.f32(), bias_ ? bias_->value.f32() : nullptr,
                          y.f32(), {x.dim(0), in_, out_});
  return y;
}

Tensor Linear::backward(const Tensor& dy) {
  MT_CHECK(dy.ndim() == 2 && dy.dim(0) == x_.dim(0) && dy.dim(1) == out_,
           "{}: grad {} expected [{}, {}]", weight_.name, to_string(dy.shape()), x_.dim(0), out_);
  Tensor dx = Tensor::empty({x_.dim(0), in_}, MemCategory::activations);
  kernels::linear_backward(x_.f32(), weight_.value.f32(), dy.f32(), dx.f32(), weight_.grad.f32(),
                           bias_ ? bias_->grad.f32() : nullptr, {x_.dim(0), in_, out_});
  x_ = Tensor();
  return dx;
}

ParameterList Linear::parameters() {
  ParameterList out{&weight_};
  if (bias_) out.push_back(&*bias_);
  return out;
}

}  // namespace meshtrain
