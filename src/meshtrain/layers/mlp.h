// src/meshtrain/layers/mlp.h — GPT-2 feed-forward: c_fc (C → 4C), GELU (tanh), c_proj (4C → C).
#pragma once

#include "meshtrain/layers/linear.h"

namespace meshtrain {

class Mlp {
 public:
  /// `<prefix>.c_fc.{weight [4C, C], bias [4C]}`, `<prefix>.c_proj.{weight [C, 4C], bias [C]}`.
  Mlp(const std::string& prefix, std::int64_t n_embd, bool bias, float init_std,
      float proj_init_std);

  /// x [tokens, C] → [tokens, C]; keeps the pre-activation for backward.
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  ParameterList parameters();

 private:
  Linear c_fc_, c_proj_;
  Tensor pre_act_;
};

}  // namespace meshtrain
