// src/meshtrain/layers/transformer_block.h — the pre-norm residual block of GPT-2 (Radford et
// al. 2019, §2.3) and Llama (Touvron et al. 2023, §2.2): x + attn(norm_1(x)), then
// + mlp(norm_2(·)). The family decides the four parts and their names; the residual stream
// is [tokens, C], or [tokens/tp, C] under sequence parallelism.
#pragma once

#include <memory>

#include "meshtrain/layers/module.h"

namespace meshtrain {

class TransformerBlock final : public Module {
 public:
  TransformerBlock(std::unique_ptr<Module> norm_1, std::unique_ptr<Module> attn,
                   std::unique_ptr<Module> norm_2, std::unique_ptr<Module> mlp);

  Tensor forward(const Tensor& x, const SequenceBatch& batch) override;
  Tensor backward(const Tensor& dy) override;
  /// norm_1, attn, norm_2, mlp parameters, in that order.
  ParameterList parameters() override;

 private:
  std::unique_ptr<Module> norm_1_, attn_, norm_2_, mlp_;
};

}  // namespace meshtrain
