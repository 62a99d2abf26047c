#include "meshtrain/transformer/mlp.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/autocast.h"

namespace meshtrain {

GeluMlp::GeluMlp(const std::string& prefix, const MlpInit& init, const PlacementTable& records,
                 const TensorParallel& tp, ParameterStorage storage)
    : fc_({{prefix + ".c_fc", init.init_std}}, records, tp, storage),
      proj_(prefix + ".c_proj", records, init.proj_init_std, tp, storage) {}

Tensor GeluMlp::forward(const Tensor& x, const SequenceBatch& /*batch*/,
                        const MicroBatchContext& ctx) {
  Tensor& pre_act = saved_.at(ctx.slot).pre_act;
  // The fc bias is added inside the GELU's pass (bias_gelu_forward), not by the linear.
  pre_act = std::move(fc_.forward(x, /*add_bias=*/false, ctx)[0]);
  Tensor act = Tensor::empty(pre_act.shape(), MemCategory::activations);
  const Parameter* bias = fc_.bias(0);
  const Tensor b = bias != nullptr ? value_f32(*bias) : Tensor();  // f32 under mixed precision
  kernels::bias_gelu_forward(pre_act.f32(), b.defined() ? b.f32() : nullptr, act.f32(),
                             pre_act.dim(0), pre_act.dim(1));
  return proj_.forward(act, ctx);
}

Tensor GeluMlp::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  Tensor d_act = proj_.backward(dy, ctx);
  {
    const State s = saved_.take(
        ctx.slot, parameters().front()->name);  // freed before the expansion's backward, as before
    // In place: dgelu reads the pre-activation and the incoming gradient element by element;
    // the fc bias gradient is summed in the same pass.
    Parameter* bias = fc_.bias(0);
    kernels::gelu_bias_backward(s.pre_act.f32(), d_act.f32(), d_act.f32(),
                                bias != nullptr ? bias->grad.f32() : nullptr, d_act.dim(0),
                                d_act.dim(1));
  }
  return fc_.backward(std::span<const Tensor>(&d_act, 1), /*bias_grads=*/false, ctx);
}

void GeluMlp::discard(const MicroBatchContext& ctx) {
  saved_.release(ctx.slot);
  fc_.discard(ctx);
  proj_.discard(ctx);
}

ParameterList GeluMlp::parameters() {
  ParameterList out = fc_.parameters();
  for (Parameter* p : proj_.parameters()) out.push_back(p);
  return out;
}

SwiGluMlp::SwiGluMlp(const std::string& prefix, const MlpInit& init,
                     const PlacementTable& records, const TensorParallel& tp,
                     ParameterStorage storage)
    : gate_up_({{prefix + ".gate_proj", init.init_std}, {prefix + ".up_proj", init.init_std}},
               records, tp, storage),
      down_(prefix + ".down_proj", records, init.proj_init_std, tp, storage) {}

Tensor SwiGluMlp::forward(const Tensor& x, const SequenceBatch& /*batch*/,
                          const MicroBatchContext& ctx) {
  std::vector<Tensor>& gate_up = saved_.at(ctx.slot).gate_up;
  gate_up = gate_up_.forward(x, ctx);
  const Tensor& gate = gate_up[0];
  Tensor act = Tensor::empty(gate.shape(), MemCategory::activations);
  kernels::swiglu_forward(gate.f32(), gate_up[1].f32(), act.f32(), act.numel());
  return down_.forward(act, ctx);
}

Tensor SwiGluMlp::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  const Tensor d_act = down_.backward(dy, ctx);
  // In place: the gate and up activations are not needed after their gradients.
  std::vector<Tensor> grads = saved_.take(ctx.slot, parameters().front()->name).gate_up;
  Tensor& gate = grads[0];
  Tensor& up = grads[1];
  kernels::swiglu_backward(gate.f32(), up.f32(), d_act.f32(), gate.f32(), up.f32(), gate.numel());
  return gate_up_.backward(grads, ctx);
}

void SwiGluMlp::discard(const MicroBatchContext& ctx) {
  saved_.release(ctx.slot);
  gate_up_.discard(ctx);
  down_.discard(ctx);
}

ParameterList SwiGluMlp::parameters() {
  ParameterList out = gate_up_.parameters();
  for (Parameter* p : down_.parameters()) out.push_back(p);
  return out;
}

}  // namespace meshtrain
