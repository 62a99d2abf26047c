// src/meshtrain/layers/linear.h — y = x·Wᵀ + b (PyTorch nn.Linear; W is [out, in]).
#pragma once

#include <memory>
#include <optional>

#include "meshtrain/layers/parameter.h"

namespace meshtrain {

class Linear {
 public:
  /// Parameters `<prefix>.weight` [out, in] ~ N(0, init_std²) and, with bias,
  /// `<prefix>.bias` [out] = 0.
  Linear(const std::string& prefix, std::int64_t in_features, std::int64_t out_features, bool bias,
         float init_std);

  /// x [tokens, in] → [tokens, out] (activations). Keeps x for backward.
  Tensor forward(const Tensor& x);
  /// dy [tokens, out] → dx [tokens, in]; accumulates weight and bias gradients.
  Tensor backward(const Tensor& dy);

  ParameterList parameters();
  Parameter& weight() { return weight_; }

 private:
  std::int64_t in_, out_;
  Parameter weight_;
  std::optional<Parameter> bias_;
  Tensor x_;
};

}  // namespace meshtrain
