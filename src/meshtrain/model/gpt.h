// src/meshtrain/model/gpt.h
//
// GPT-2-style decoder (Radford et al. 2019): learned token and position embeddings, n_layer
// pre-LayerNorm blocks, final LayerNorm, LM head tied to the token embedding, mean softmax
// cross-entropy over all tokens. Parameter names as Hugging Face GPT-2 (transformer.wte.weight,
// transformer.h.0.attn.c_attn.weight, ...), weights in nn.Linear layout [out, in] (HF's Conv1D
// stores [in, out]: an exporter transposes, the model never does).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/layers/layer_norm.h"
#include "meshtrain/layers/parameter.h"
#include "meshtrain/layers/transformer_block.h"

namespace meshtrain {

class GptModel {
 public:
  /// Builds and allocates every parameter (config validated and vocab_size > 0 beforehand)
  /// and initialises it from (seed, name, index): N(0, init_std²) for weights and embeddings,
  /// N(0, (init_std/√(2·n_layer))²) for the residual projections c_proj (GPT-2 §2.3), zeros
  /// for biases, ones for LayerNorm weights.
  GptModel(const ModelConfig& config, std::uint64_t seed);

  /// tokens, targets [batch, T] i32 (T ≤ block_size) → mean cross-entropy over batch·T tokens.
  /// Keeps what backward needs.
  float forward(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t batch,
                std::int64_t seq_len);
  /// Backward of `loss_scale` × the last forward's loss: gradients are ACCUMULATED into every
  /// Parameter::grad (pass 1/accumulation for gradient accumulation).
  void backward(float loss_scale);
  /// tokens [batch, T] → logits [batch·T, vocab] (no loss, nothing kept for backward).
  Tensor logits(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len);

  /// Every parameter once (the tied LM head is transformer.wte.weight), in construction order:
  /// wte, wpe, h.0 …, ln_f.
  const ParameterList& parameters() const noexcept { return params_; }
  void zero_grad();
  const ModelConfig& config() const noexcept { return config_; }
  /// 6·N + 12·n_layer·C·T FLOPs per token for forward+backward (Kaplan et al. 2020, §2.1,
  /// with the attention term as PaLM, Chowdhery et al. 2022, App. B); N excludes wpe.
  double flops_per_token(std::int64_t seq_len) const;

 private:
  Tensor hidden(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len);

  ModelConfig config_;
  Parameter wte_;  // [vocab, C]
  Parameter wpe_;  // [block_size, C]
  std::vector<std::unique_ptr<TransformerBlock>> blocks_;
  LayerNorm ln_f_;
  ParameterList params_;

  // Kept between forward and backward.
  std::vector<std::int32_t> tokens_, targets_, positions_;
  std::int64_t batch_ = 0, seq_len_ = 0;
  Tensor final_hidden_, logits_, lse_;
};

}  // namespace meshtrain
