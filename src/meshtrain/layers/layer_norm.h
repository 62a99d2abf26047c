// src/meshtrain/layers/layer_norm.h — LayerNorm over features (Ba et al. 2016), eps 1e-5 as
// PyTorch's default and GPT-2's.
#pragma once

#include <optional>

#include "meshtrain/layers/parameter.h"

namespace meshtrain {

class LayerNorm {
 public:
  /// `<prefix>.weight` [C] = 1 and, with bias, `<prefix>.bias` [C] = 0.
  LayerNorm(const std::string& prefix, std::int64_t features, bool bias);

  /// x [tokens, C] → [tokens, C]; keeps x, mean and rstd for backward.
  Tensor forward(const Tensor& x);
  /// dy [tokens, C] → dx [tokens, C]; accumulates weight and bias gradients.
  Tensor backward(const Tensor& dy);
  ParameterList parameters();

  static constexpr float kEps = 1e-5f;

 private:
  std::int64_t features_;
  Parameter weight_;
  std::optional<Parameter> bias_;
  Tensor x_, mean_, rstd_;
};

}  // namespace meshtrain
