// src/meshtrain/layers/norms.h — the two normalisations over features: LayerNorm (Ba et al.
// 2016; GPT-2, eps 1e-5 as PyTorch's default) and RMSNorm (Zhang & Sennrich 2019; Llama).
// Their weights (and LayerNorm's bias) are replicated over tp; under sequence parallelism each
// rank normalises its own token rows, so their gradients are partial sums over its tokens
// that the trainer sums over tp once per step.
#pragma once

#include <optional>
#include <string>

#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/module.h"

namespace meshtrain {

class LayerNorm final : public Module {
 public:
  /// `<prefix>.weight` [C] = 1 and, with bias, `<prefix>.bias` [C] = 0.
  LayerNorm(const std::string& prefix, std::int64_t features, bool bias, float eps);

  /// x [rows, C] → [rows, C]; keeps x, mean and rstd [rows] in the current activation slot.
  Tensor forward(const Tensor& x, const SequenceBatch& batch) override;
  Tensor backward(const Tensor& dy) override;
  ParameterList parameters() override;
  void discard() override { saved_.release(); }

 private:
  std::int64_t features_;
  float eps_;
  Parameter weight_;
  std::optional<Parameter> bias_;
  struct State {
    Tensor x, mean, rstd;
  };
  Saved<State> saved_;
};

class RmsNorm final : public Module {
 public:
  /// `<prefix>.weight` [C] = 1 (Hugging Face LlamaRMSNorm).
  RmsNorm(const std::string& prefix, std::int64_t features, float eps);

  /// x [rows, C] → [rows, C]; keeps x and rstd [rows] in the current activation slot.
  Tensor forward(const Tensor& x, const SequenceBatch& batch) override;
  Tensor backward(const Tensor& dy) override;
  ParameterList parameters() override;
  void discard() override { saved_.release(); }

 private:
  std::int64_t features_;
  float eps_;
  Parameter weight_;
  struct State {
    Tensor x, rstd;
  };
  Saved<State> saved_;
};

}  // namespace meshtrain
