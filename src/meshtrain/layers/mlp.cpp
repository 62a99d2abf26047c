#include "meshtrain/layers/mlp.h"

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

Mlp::Mlp(const std::string& prefix, std::int64_t n_embd, bool bias, float init_std,
         float proj_init_std)
    : c_fc_(prefix + ".c_fc", n_embd, 4 * n_embd, bias, init_std),
      c_proj_(prefix + ".c_proj", 4 * n_embd, n_embd, bias, proj_init_std) {}

Tensor Mlp::forward(const Tensor& x) {
  pre_act_ = c_fc_.forward(x);
  Tensor act = Tensor::empty(pre_act_.shape(), MemCategory::activations);
  kernels::gelu_forward(pre_act_.f32(), act.f32(), act.numel());
  return c_proj_.forward(act);
}

Tensor Mlp::backward(const Tensor& dy) {
  Tensor d_act = c_proj_.backward(dy);
  // In place: dgelu reads the pre-activation and the incoming gradient element by element.
  kernels::gelu_backward(pre_act_.f32(), d_act.f32(), d_act.f32(), d_act.numel());
  pre_act_ = Tensor();
  return c_fc_.backward(d_act);
}

ParameterList Mlp::parameters() {
  ParameterList out = c_fc_.parameters();
  for (Parameter* p : c_proj_.parameters()) out.push_back(p);
  return out;
}

}  // namespace meshtrain
