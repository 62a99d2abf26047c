// src/meshtrain/transformer/mlp.h — the two feed-forward blocks, each a column-parallel expansion
// and a row-parallel projection with the nonlinearity on local features in between (Shoeybi
// et al. 2019, §3, Fig. 3a: the split needs no communication inside the block).
//   GeluMlp (GPT-2): `<prefix>.c_fc` [F, C], GELU (tanh), `<prefix>.c_proj` [C, F].
//   SwiGluMlp (Llama; Shazeer 2020): `<prefix>.{gate_proj, up_proj}` [F, C],
//     silu(gate)·up, `<prefix>.down_proj` [C, F].
// F % tp == 0 (validated with the config). Every tensor is allocated from its record of the
// placement table (parallel_linear.h), which gives C, F and whether there are biases.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/module.h"
#include "meshtrain/parallel/tp/parallel_linear.h"

namespace meshtrain {

/// The weights' initial N(0, std²) (the biases start at zero).
struct MlpInit {
  float init_std;       // expansion weights
  float proj_init_std;  // projection back to C
};

class GeluMlp final : public Module {
 public:
  GeluMlp(const std::string& prefix, const MlpInit& init, const PlacementTable& records,
          const TensorParallel& tp, ParameterStorage storage = ParameterStorage::allocated);
  /// x [tokens(/tp), C] → same layout; keeps the pre-activation [tokens, F/tp] in slot
  /// ctx.slot (plus what its linears keep).
  Tensor forward(const Tensor& x, const SequenceBatch& batch,
                 const MicroBatchContext& ctx) override;
  /// Frees the slot's state.
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) override;
  ParameterList parameters() override;
  void discard(const MicroBatchContext& ctx) override;

 private:
  ColumnParallelLinear fc_;
  RowParallelLinear proj_;
  struct State {
    Tensor pre_act;
  };
  Saved<State> saved_;
};

class SwiGluMlp final : public Module {
 public:
  SwiGluMlp(const std::string& prefix, const MlpInit& init, const PlacementTable& records,
            const TensorParallel& tp, ParameterStorage storage = ParameterStorage::allocated);
  /// x [tokens(/tp), C] → same layout; keeps gate and up, [tokens, F/tp] each, in slot
  /// ctx.slot (plus what its linears keep).
  Tensor forward(const Tensor& x, const SequenceBatch& batch,
                 const MicroBatchContext& ctx) override;
  /// Frees the slot's state; gate and up are overwritten by their gradients (which deferred
  /// weight gradients of gate_proj and up_proj keep until W).
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx) override;
  ParameterList parameters() override;
  void discard(const MicroBatchContext& ctx) override;

 private:
  ColumnParallelLinear gate_up_;
  RowParallelLinear down_;
  struct State {
    std::vector<Tensor> gate_up;  // forward outputs of gate_proj and up_proj
  };
  Saved<State> saved_;
};

}  // namespace meshtrain
