#include "meshtrain/model/gpt.h"

#include <fmt/format.h>

#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

GptModel::GptModel(const ModelConfig& config, std::uint64_t seed)
    : config_(config),
      wte_("transformer.wte.weight", {config.vocab_size, config.n_embd}, InitKind::normal,
           static_cast<float>(config.init_std)),
      wpe_("transformer.wpe.weight", {config.block_size, config.n_embd}, InitKind::normal,
           static_cast<float>(config.init_std)),
      ln_f_("transformer.ln_f", config.n_embd, config.bias) {
  MT_CHECK(config.vocab_size > 0, "vocab_size must be known before building the model");
  const AttentionShape shape{
      .n_embd = config.n_embd,
      .n_head = config.n_head,
      .bias = config.bias,
      .init_std = static_cast<float>(config.init_std),
      .proj_init_std = static_cast<float>(config.init_std /
                                          std::sqrt(2.0 * static_cast<double>(config.n_layer))),
  };
  params_ = {&wte_, &wpe_};
  for (std::int64_t i = 0; i < config.n_layer; ++i) {
    blocks_.push_back(
        std::make_unique<TransformerBlock>(fmt::format("transformer.h.{}", i), shape));
    for (Parameter* p : blocks_.back()->parameters()) params_.push_back(p);
  }
  for (Parameter* p : ln_f_.parameters()) params_.push_back(p);
  for (Parameter* p : params_) initialize(*p, seed);
}

Tensor GptModel::hidden(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len) {
  MT_CHECK(seq_len >= 1 && seq_len <= config_.block_size, "sequence length {} outside [1, {}]",
           seq_len, config_.block_size);
  const std::int64_t rows = batch * seq_len;
  const std::int64_t C = config_.n_embd;
  for (std::int64_t i = 0; i < rows; ++i) {
    MT_CHECK(tokens[i] >= 0 && tokens[i] < config_.vocab_size, "token {} at {} outside vocab {}",
             tokens[i], i, config_.vocab_size);
  }
  tokens_.assign(tokens, tokens + rows);
  positions_.resize(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    positions_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % seq_len);
  }
  Tensor x = Tensor::empty({rows, C}, MemCategory::activations);
  Tensor pos = Tensor::empty({rows, C}, MemCategory::activations);
  kernels::embedding_forward(tokens_.data(), wte_.value.f32(), x.f32(), rows, C);
  kernels::embedding_forward(positions_.data(), wpe_.value.f32(), pos.f32(), rows, C);
  kernels::add_inplace(x.f32(), pos.f32(), x.numel());
  for (auto& block : blocks_) x = block->forward(x, batch, seq_len);
  return ln_f_.forward(x);
}

Tensor GptModel::logits(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len) {
  const Tensor h = hidden(tokens, batch, seq_len);
  Tensor out = Tensor::empty({h.dim(0), config_.vocab_size}, MemCategory::activations);
  kernels::linear_forward(h.f32(), wte_.value.f32(), nullptr, out.f32(),
                          {h.dim(0), config_.n_embd, config_.vocab_size});
  return out;
}

float GptModel::forward(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t batch,
                        std::int64_t seq_len) {
  batch_ = batch;
  seq_len_ = seq_len;
  final_hidden_ = hidden(tokens, batch, seq_len);
  const std::int64_t rows = batch * seq_len;
  const std::int64_t V = config_.vocab_size;
  logits_ = Tensor::empty({rows, V}, MemCategory::activations);
  kernels::linear_forward(final_hidden_.f32(), wte_.value.f32(), nullptr, logits_.f32(),
                          {rows, config_.n_embd, V});
  for (std::int64_t i = 0; i < rows; ++i) {
    MT_CHECK(targets[i] >= 0 && targets[i] < V, "target {} at {} outside vocab {}", targets[i], i,
             V);
  }
  targets_.assign(targets, targets + rows);
  Tensor losses = Tensor::empty({rows}, MemCategory::activations);
  lse_ = Tensor::empty({rows}, MemCategory::activations);
  kernels::cross_entropy_forward(logits_.f32(), targets_.data(), losses.f32(), lse_.f32(), rows, V);
  double sum = 0.0;
  for (std::int64_t i = 0; i < rows; ++i) sum += losses.f32()[i];
  return static_cast<float>(sum / static_cast<double>(rows));
}

void GptModel::backward(float loss_scale) {
  MT_CHECK(logits_.defined(), "backward without a forward");
  const std::int64_t rows = batch_ * seq_len_;
  const std::int64_t V = config_.vocab_size;
  const std::int64_t C = config_.n_embd;
  // dlogits overwrites the logits buffer: nothing reads the logits after this.
  kernels::cross_entropy_backward(logits_.f32(), lse_.f32(), targets_.data(),
                                  loss_scale / static_cast<float>(rows), logits_.f32(), rows, V);
  Tensor dx = Tensor::empty({rows, C}, MemCategory::activations);
  // The tied LM head: its weight gradient lands in wte's, next to the embedding's.
  kernels::linear_backward(final_hidden_.f32(), wte_.value.f32(), logits_.f32(), dx.f32(),
                           wte_.grad.f32(), nullptr, {rows, C, V});
  logits_ = lse_ = final_hidden_ = Tensor();
  dx = ln_f_.backward(dx);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) dx = (*it)->backward(dx);
  kernels::embedding_backward(tokens_.data(), dx.f32(), wte_.grad.f32(), rows, C);
  kernels::embedding_backward(positions_.data(), dx.f32(), wpe_.grad.f32(), rows, C);
}

void GptModel::zero_grad() {
  for (Parameter* p : params_) p->grad.zero();
}

double GptModel::flops_per_token(std::int64_t seq_len) const {
  double n = 0.0;
  for (const Parameter* p : params_) {
    if (p != &wpe_) n += static_cast<double>(p->value.numel());
  }
  return 6.0 * n + 12.0 * static_cast<double>(config_.n_layer * config_.n_embd * seq_len);
}

}  // namespace meshtrain
