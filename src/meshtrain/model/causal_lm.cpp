#include "meshtrain/model/causal_lm.h"

#include <fmt/format.h>

#include <cmath>

#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/attention.h"
#include "meshtrain/layers/mlp.h"
#include "meshtrain/layers/norms.h"

namespace meshtrain {
namespace {

bool is_llama(const ModelConfig& c) { return c.family == "llama"; }

std::string embedding_name(const ModelConfig& c) {
  return is_llama(c) ? "model.embed_tokens.weight" : "transformer.wte.weight";
}

std::unique_ptr<Module> norm(const ModelConfig& c, const std::string& prefix) {
  const auto eps = static_cast<float>(c.norm_eps);
  if (is_llama(c)) return std::make_unique<RmsNorm>(prefix, c.n_embd, eps);
  return std::make_unique<LayerNorm>(prefix, c.n_embd, c.bias, eps);
}

std::unique_ptr<TransformerBlock> block(const ModelConfig& c, std::int64_t i,
                                        const TensorParallel& tp) {
  const bool llama = is_llama(c);
  const auto init_std = static_cast<float>(c.init_std);
  // GPT-2 scales the residual projections by 1/√(2·n_layer) (Radford et al. 2019, §2.3);
  // Hugging Face Llama initialises every linear alike.
  const float proj_std =
      llama ? init_std
            : static_cast<float>(c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layer)));
  const AttentionShape attn{.n_embd = c.n_embd,
                            .n_head = c.n_head,
                            .n_kv_head = kv_heads_of(c),
                            .bias = c.bias,
                            .init_std = init_std,
                            .proj_init_std = proj_std,
                            .rope_theta = llama ? static_cast<float>(c.rope_theta) : 0.0f,
                            .fused_qkv = !llama};
  const MlpShape mlp{.n_embd = c.n_embd,
                     .hidden = ffn_hidden_of(c),
                     .bias = c.bias,
                     .init_std = init_std,
                     .proj_init_std = proj_std};
  if (llama) {
    const std::string p = fmt::format("model.layers.{}", i);
    return std::make_unique<TransformerBlock>(
        norm(c, p + ".input_layernorm"),
        std::make_unique<CausalSelfAttention>(p + ".self_attn", attn, tp),
        norm(c, p + ".post_attention_layernorm"), std::make_unique<SwiGluMlp>(p + ".mlp", mlp, tp));
  }
  const std::string p = fmt::format("transformer.h.{}", i);
  return std::make_unique<TransformerBlock>(
      norm(c, p + ".ln_1"), std::make_unique<CausalSelfAttention>(p + ".attn", attn, tp),
      norm(c, p + ".ln_2"), std::make_unique<GeluMlp>(p + ".mlp", mlp, tp));
}

}  // namespace

CausalLm::CausalLm(const ModelConfig& config, std::uint64_t seed, const TensorParallel& tp)
    : config_(config),
      tp_(tp),
      embed_(embedding_name(config), config.vocab_size, config.n_embd,
             static_cast<float>(config.init_std), tp) {
  MT_CHECK(config.vocab_size > 0, "vocab_size must be known before building the model");
  const bool llama = is_llama(config);
  params_ = {&embed_.weight()};
  if (!llama) {
    wpe_.emplace("transformer.wpe.weight", Shape{config.block_size, config.n_embd},
                 InitKind::normal, static_cast<float>(config.init_std));
    params_.push_back(&*wpe_);
  }
  for (std::int64_t i = 0; i < config.n_layer; ++i) {
    blocks_.push_back(block(config, i, tp));
    for (Parameter* p : blocks_.back()->parameters()) params_.push_back(p);
  }
  final_norm_ = norm(config, llama ? "model.norm" : "transformer.ln_f");
  for (Parameter* p : final_norm_->parameters()) params_.push_back(p);
  if (llama) {
    lm_head_.emplace(vocab_shard_parameter("lm_head.weight", config.vocab_size, config.n_embd,
                                           static_cast<float>(config.init_std), tp.group));
    params_.push_back(&*lm_head_);
  }
  head_ = std::make_unique<VocabParallelLmHead>(llama ? *lm_head_ : embed_.weight(), tp);
  for (Parameter* p : params_) initialize(*p, seed);
}

Tensor CausalLm::hidden(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len) {
  MT_CHECK(seq_len >= 1 && seq_len <= config_.block_size, "sequence length {} outside [1, {}]",
           seq_len, config_.block_size);
  batch_ = SequenceBatch{batch, seq_len};
  const std::int64_t rows = batch_.tokens();
  for (std::int64_t i = 0; i < rows; ++i) {
    MT_CHECK(tokens[i] >= 0 && tokens[i] < config_.vocab_size, "token {} at {} outside vocab {}",
             tokens[i], i, config_.vocab_size);
  }
  Tensor x = embed_.forward(tokens, rows);  // [rows, C], or this rank's rows under SP
  if (wpe_) {
    // Under sequence parallelism this rank holds rows [r·rows/tp, (r+1)·rows/tp).
    const std::int64_t local = x.dim(0);
    const std::int64_t first = tp_.sequence_parallel ? tp_.group.rank() * local : 0;
    positions_.resize(static_cast<std::size_t>(local));
    for (std::int64_t i = 0; i < local; ++i) {
      positions_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((first + i) % seq_len);
    }
    Tensor pos = Tensor::empty(x.shape(), MemCategory::activations);
    kernels::embedding_shard_forward(positions_.data(), wpe_->value.f32(), 0, config_.block_size,
                                     pos.f32(), local, config_.n_embd);
    kernels::add_inplace(x.f32(), pos.f32(), x.numel());
  }
  for (auto& b : blocks_) x = b->forward(x, batch_);
  return final_norm_->forward(x, batch_);
}

float CausalLm::forward(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t batch,
                        std::int64_t seq_len) {
  const Tensor h = hidden(tokens, batch, seq_len);
  forwarded_ = true;
  return head_->forward(h, targets);
}

void CausalLm::backward(float loss_scale) {
  MT_CHECK(forwarded_, "backward without a forward");
  forwarded_ = false;
  Tensor dx = final_norm_->backward(head_->backward(loss_scale));
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) dx = (*it)->backward(dx);
  embed_.backward(dx);
  if (wpe_) {
    kernels::embedding_shard_backward(positions_.data(), dx.f32(), 0, config_.block_size,
                                      wpe_->grad.f32(), dx.dim(0), config_.n_embd);
  }
}

Tensor CausalLm::logits(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len) {
  MT_CHECK(!tp_.sequence_parallel || (batch * seq_len) % tp_.group.size() == 0,
           "{} tokens cannot be split over {} sequence-parallel ranks", batch * seq_len,
           tp_.group.size());
  forwarded_ = false;
  return head_->logits(hidden(tokens, batch, seq_len));
}

void CausalLm::zero_grad() {
  for (Parameter* p : params_) p->grad.zero();
}

double CausalLm::flops_per_token(std::int64_t seq_len) const {
  double n = 0.0;
  for (const Parameter* p : params_) {
    const bool lookup_only = (wpe_ && p == &*wpe_) || (lm_head_ && p == &embed_.weight());
    if (!lookup_only) n += static_cast<double>(p->logical_numel());
  }
  return 6.0 * n + 12.0 * static_cast<double>(config_.n_layer * config_.n_embd * seq_len);
}

}  // namespace meshtrain
