#include "meshtrain/model/causal_lm.h"

#include <fmt/format.h>

#include <cmath>

#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/autocast.h"
#include "meshtrain/layers/norms.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/transformer/attention.h"
#include "meshtrain/transformer/mlp.h"
#include "meshtrain/transformer/moe.h"

namespace meshtrain {
namespace {

bool is_llama(const ModelConfig& c) { return c.family == ModelFamily::llama; }

std::string embedding_name(const ModelConfig& c) {
  return is_llama(c) ? "model.embed_tokens.weight" : "transformer.wte.weight";
}

std::unique_ptr<Module> norm(const ModelConfig& c, const std::string& prefix,
                             const PlacementTable& records, ParameterStorage storage) {
  const auto eps = static_cast<float>(c.norm_eps);
  if (is_llama(c)) return std::make_unique<RmsNorm>(prefix, records, eps, storage);
  return std::make_unique<LayerNorm>(prefix, records, eps, storage);
}

// The table of a whole model on the groups' layout (one pipeline stage, one chunk).
PlacementTable whole_model_table(const ModelConfig& c, const ParallelGroups& groups) {
  const PlacementLayout layout{.mesh = {.pp = 1,
                                        .dp = groups.ep.size(),
                                        .cp = groups.cp.size(),
                                        .tp = groups.tp.group.size(),
                                        .ep = groups.ep.size()},
                               .sequence_parallel = groups.tp.sequence_parallel,
                               .layers_per_chunk = {c.n_layer}};
  return placement_table(c, layout);
}

// Block i's MoE feed-forward (Mixtral names under `prefix`), or nullptr when block i is dense.
std::unique_ptr<SparseMoeBlock> moe_mlp(const ModelConfig& c, std::int64_t i,
                                        const std::string& prefix, const PlacementTable& records,
                                        const ParallelGroups& groups, float init_std,
                                        float proj_std, ParameterStorage storage) {
  if (c.moe_experts < 1 || i % c.moe_layer_freq != 0) return nullptr;
  const MoeShape shape{.n_embd = c.n_embd,
                       .moe_experts = c.moe_experts,
                       .moe_top_k = c.moe_top_k,
                       .moe_ffn_hidden = moe_ffn_hidden_of(c),
                       .init_std = init_std,
                       .proj_init_std = proj_std};
  const MoeOptions options{.moe_capacity_factor = c.moe_capacity_factor,
                           .moe_token_drop_policy = c.moe_token_drop_policy,
                           .moe_aux_loss_coeff = c.moe_aux_loss_coeff,
                           .moe_z_loss_coeff = c.moe_z_loss_coeff};
  return std::make_unique<SparseMoeBlock>(prefix, shape, options, records, groups.ep,
                                          groups.moe_tokens, storage);
}

std::unique_ptr<TransformerBlock> block(const ModelConfig& c, std::int64_t i,
                                        const PlacementTable& records,
                                        const ParallelGroups& groups, RecomputeMode recompute,
                                        ParameterStorage storage, std::vector<MoeLayerRef>& moe,
                                        std::vector<const CausalSelfAttention*>& attention) {
  const TensorParallel& tp = groups.tp;
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
                            .init_std = init_std,
                            .proj_init_std = proj_std,
                            .rope_theta = llama ? static_cast<float>(c.rope_theta) : 0.0f,
                            .fused_qkv = !llama};
  const MlpInit mlp{.init_std = init_std, .proj_init_std = proj_std};
  auto attention_of = [&](const std::string& name) {
    auto layer =
        std::make_unique<CausalSelfAttention>(name, attn, records, groups, recompute, storage);
    attention.push_back(layer.get());
    return layer;
  };
  if (llama) {
    const std::string p = fmt::format("model.layers.{}", i);
    std::unique_ptr<Module> ffn = moe_mlp(c, i, p, records, groups, init_std, proj_std, storage);
    if (ffn) {
      moe.push_back({i, static_cast<SparseMoeBlock*>(ffn.get())});
    } else {
      ffn = std::make_unique<SwiGluMlp>(p + ".mlp", mlp, records, tp, storage);
    }
    return std::make_unique<TransformerBlock>(
        norm(c, p + ".input_layernorm", records, storage), attention_of(p + ".self_attn"),
        norm(c, p + ".post_attention_layernorm", records, storage), std::move(ffn), recompute);
  }
  const std::string p = fmt::format("transformer.h.{}", i);
  return std::make_unique<TransformerBlock>(
      norm(c, p + ".ln_1", records, storage), attention_of(p + ".attn"),
      norm(c, p + ".ln_2", records, storage),
      std::make_unique<GeluMlp>(p + ".mlp", mlp, records, tp, storage), recompute);
}

}  // namespace

CausalLm::CausalLm(const ModelConfig& config, std::uint64_t seed, const ParallelGroups& groups,
                   RecomputeMode recompute, ParameterStorage storage)
    : CausalLm(config, seed, groups, whole_model_table(config, groups), {}, recompute, storage) {}

CausalLm::CausalLm(const ModelConfig& config, std::uint64_t seed, const ParallelGroups& groups,
                   const PlacementTable& records, const ChunkLayout& layout,
                   RecomputeMode recompute, ParameterStorage storage)
    : config_(config), tp_(groups.tp), cp_(groups.cp), layout_(layout) {
  const TensorParallel& tp = groups.tp;
  MT_CHECK(config.vocab_size > 0, "vocab_size must be known before building the model");
  if (layout_.num_layers < 0) layout_.num_layers = config.n_layer - layout_.first_layer;
  MT_CHECK(layout_.first_layer >= 0 && layout_.num_layers >= 0 &&
               layout_.first_layer + layout_.num_layers <= config.n_layer,
           "chunk of layers [{}, +{}) outside the model's {}", layout_.first_layer,
           layout_.num_layers, config.n_layer);
  const bool llama = is_llama(config);
  const auto init_std = static_cast<float>(config.init_std);
  if (layout_.has_embedding) {
    embed_ = std::make_unique<VocabParallelEmbedding>(records.at(embedding_name(config)),
                                                      init_std, tp, storage);
    params_.push_back(&embed_->weight());
    if (!llama) {
      wpe_.emplace(records.at("transformer.wpe.weight"), 0, 1, InitKind::normal, init_std,
                   storage);
      params_.push_back(&*wpe_);
    }
  }
  for (std::int64_t i = layout_.first_layer; i < layout_.first_layer + layout_.num_layers; ++i) {
    blocks_.push_back(block(config, i, records, groups, recompute, storage, moe_, attention_));
    for (Parameter* p : blocks_.back()->parameters()) params_.push_back(p);
  }
  if (layout_.has_head) {
    final_norm_ = norm(config, llama ? "model.norm" : "transformer.ln_f", records, storage);
    for (Parameter* p : final_norm_->parameters()) params_.push_back(p);
    if (llama || !layout_.has_embedding) {
      // llama's own head, or gpt2's tied embedding on a later pipeline stage: a copy with the
      // embedding's name and initial values (its record the tied copy), its gradient summed
      // with the embedding's.
      const ParamPlacement& record =
          llama ? records.at("lm_head.weight") : records.at(embedding_name(config), true);
      lm_head_.emplace(vocab_shard_parameter(record, init_std, tp.group, storage));
      params_.push_back(&*lm_head_);
    }
    head_ = std::make_unique<VocabParallelLmHead>(lm_head_ ? *lm_head_ : embed_->weight(), tp);
  }
  for (Parameter* p : params_) initialize(*p, seed);
  if (layout_.has_embedding) {
    units_.push_back({&embed_->weight()});
    if (wpe_) units_.back().push_back(&*wpe_);
  }
  first_block_unit_ = static_cast<int>(units_.size());
  for (auto& b : blocks_) units_.push_back(b->parameters());
  if (layout_.has_head) {
    units_.push_back(final_norm_->parameters());
    units_.back().push_back(lm_head_ ? &*lm_head_ : &embed_->weight());
  }
}

void CausalLm::before_forward(int unit) {
  if (!hooks_) return;
  const auto next = static_cast<std::size_t>(unit + 1);
  hooks_->before_forward(units_[static_cast<std::size_t>(unit)],
                         next < units_.size() ? &units_[next] : nullptr);
}

void CausalLm::after_forward(int unit) {
  if (hooks_) hooks_->after_forward(units_[static_cast<std::size_t>(unit)]);
}

void CausalLm::before_backward(int unit) {
  if (!hooks_) return;
  hooks_->before_backward(units_[static_cast<std::size_t>(unit)],
                          unit > 0 ? &units_[static_cast<std::size_t>(unit - 1)] : nullptr);
}

void CausalLm::after_backward(int unit) {
  if (hooks_) hooks_->after_backward(units_[static_cast<std::size_t>(unit)]);
}

Tensor CausalLm::forward_blocks(const std::int32_t* tokens, const Tensor& x_in, std::int64_t batch,
                                std::int64_t seq_len, const MicroBatchContext& ctx) {
  MT_CHECK(seq_len >= 1 && seq_len * cp_.size() <= config_.block_size,
           "sequence length {} × cp {} outside [1, {}]", seq_len, cp_.size(), config_.block_size);
  State& state = saved_.at(ctx.slot);
  state.batch = SequenceBatch{batch, seq_len};
  Tensor x = x_in;
  if (layout_.has_embedding) {
    before_forward(0);
    const std::int64_t rows = state.batch.tokens();
    for (std::int64_t i = 0; i < rows; ++i) {
      MT_CHECK(tokens[i] >= 0 && tokens[i] < config_.vocab_size, "token {} at {} outside vocab {}",
               tokens[i], i, config_.vocab_size);
    }
    x = embed_->forward(tokens, rows, ctx);  // [rows, C], or this rank's rows under SP
    if (wpe_) {
      // Under sequence parallelism this rank holds rows [r·rows/tp, (r+1)·rows/tp) of its
      // cp share; a row's position is global (the zigzag split, parallel/cp/context_parallel.h).
      const std::int64_t local = x.dim(0);
      const std::int64_t first = tp_.sequence_parallel ? tp_.group.rank() * local : 0;
      state.positions.resize(static_cast<std::size_t>(local));
      for (std::int64_t i = 0; i < local; ++i) {
        state.positions[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(
            zigzag_position((first + i) % seq_len, seq_len, cp_.rank(), cp_.size()));
      }
      Tensor pos = Tensor::empty(x.shape(), MemCategory::activations);
      embedding_lookup(state.positions.data(), wpe_->value, 0, config_.block_size, pos.f32(),
                       local);
      kernels::add_inplace(x.f32(), pos.f32(), x.numel());
    }
    after_forward(0);
  }
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const int unit = first_block_unit_ + static_cast<int>(i);
    before_forward(unit);
    {
      const trace::Scope traced(trace::Kind::block_forward, -1, -1,
                                static_cast<int>(layout_.first_layer) + static_cast<int>(i));
      x = blocks_[i]->forward(x, state.batch, ctx);
    }
    after_forward(unit);
  }
  return x;
}

float CausalLm::forward_head(const Tensor& h, const std::int32_t* targets,
                             const MicroBatchContext& ctx) {
  MT_CHECK(layout_.has_head, "forward_head on a chunk without the head");
  State& state = saved_.at(ctx.slot);
  state.forwarded = true;
  const int unit = static_cast<int>(units_.size()) - 1;
  before_forward(unit);
  const float loss = head_->forward(final_norm_->forward(h, state.batch, ctx), targets, ctx);
  after_forward(unit);
  return loss;
}

Tensor CausalLm::backward_head(float loss_scale, const MicroBatchContext& ctx) {
  State& state = saved_.at(ctx.slot);
  MT_CHECK(layout_.has_head && state.forwarded, "backward without a forward");
  state.forwarded = false;
  const int unit = static_cast<int>(units_.size()) - 1;
  before_backward(unit);
  Tensor dh = final_norm_->backward(head_->backward(loss_scale, ctx), ctx);
  after_backward(unit);
  return dh;
}

Tensor CausalLm::backward_blocks(const Tensor& dh, const MicroBatchContext& ctx) {
  Tensor dx = dh;
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    const int unit = first_block_unit_ + static_cast<int>(i);
    before_backward(unit);
    {
      const trace::Scope traced(trace::Kind::block_backward, -1, -1,
                                static_cast<int>(layout_.first_layer) + static_cast<int>(i));
      dx = blocks_[i]->backward(dx, ctx);
    }
    after_backward(unit);
  }
  if (!layout_.has_embedding) {
    saved_.release(ctx.slot);
    return dx;
  }
  before_backward(0);
  embed_->backward(dx, ctx);
  if (wpe_) {
    const State& state = saved_.at(ctx.slot);
    kernels::embedding_shard_backward(state.positions.data(), dx.f32(), 0, config_.block_size,
                                      wpe_->grad.f32(), dx.dim(0), config_.n_embd);
  }
  after_backward(0);
  saved_.release(ctx.slot);
  return Tensor();
}

float CausalLm::forward(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t batch,
                        std::int64_t seq_len, const MicroBatchContext& ctx) {
  MT_CHECK(layout_.has_embedding && layout_.has_head, "forward of a whole model on a chunk");
  return forward_head(forward_blocks(tokens, Tensor(), batch, seq_len, ctx), targets, ctx);
}

void CausalLm::backward(float loss_scale, const MicroBatchContext& ctx) {
  backward_blocks(backward_head(loss_scale, ctx), ctx);
}

Tensor CausalLm::logits(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len,
                        const MicroBatchContext& ctx) {
  MT_CHECK(layout_.has_embedding && layout_.has_head, "logits of a whole model on a chunk");
  MT_CHECK(!tp_.sequence_parallel || (batch * seq_len) % tp_.group.size() == 0,
           "{} tokens cannot be split over {} sequence-parallel ranks", batch * seq_len,
           tp_.group.size());
  const Tensor h = forward_blocks(tokens, Tensor(), batch, seq_len, ctx);
  const int unit = static_cast<int>(units_.size()) - 1;
  before_forward(unit);
  State& state = saved_.at(ctx.slot);
  const Tensor logits = head_->logits(final_norm_->forward(h, state.batch, ctx));
  after_forward(unit);
  state.forwarded = false;
  return logits;
}

void CausalLm::discard(const MicroBatchContext& ctx) {
  if (embed_) embed_->discard(ctx);
  for (auto& b : blocks_) b->discard(ctx);
  if (final_norm_) final_norm_->discard(ctx);
  if (head_) head_->discard(ctx);
  saved_.release(ctx.slot);
}

void CausalLm::zero_grad() {
  for (Parameter* p : params_) {
    if (p->grad.defined()) p->grad.zero();
  }
}

double CausalLm::flops_per_token(std::int64_t seq_len) const {
  // Counted over the whole model whatever this chunk holds: MFU is a property of the model.
  const bool llama = is_llama(config_);
  const double C = static_cast<double>(config_.n_embd);
  const double V = static_cast<double>(config_.vocab_size);
  const double F = static_cast<double>(ffn_hidden_of(config_));
  const double head_dim = C / static_cast<double>(config_.n_head);
  const double kv = static_cast<double>(kv_heads_of(config_)) * head_dim;
  const double bias = config_.bias ? 1.0 : 0.0;
  const double attn = C * C + 2.0 * C * kv + C * C + bias * (C + 2.0 * kv + C);
  const double mlp = (llama ? 3.0 : 2.0) * C * F + bias * (F + C);
  const double norm = C + bias * C;  // weight (and gpt2's bias)
  // A MoE block's ACTIVE parameters (what a token multiplies): the router [E, C] and top_k
  // SwiGLU experts of width F_moe, instead of the dense MLP.
  double moe_blocks = 0.0, moe_delta = 0.0;
  if (config_.moe_experts > 0) {
    const double f_moe = static_cast<double>(moe_ffn_hidden_of(config_));
    moe_blocks = static_cast<double>((config_.n_layer + config_.moe_layer_freq - 1) /
                                     config_.moe_layer_freq);
    moe_delta = static_cast<double>(config_.moe_experts) * C +
                static_cast<double>(config_.moe_top_k) * 3.0 * C * f_moe - mlp;
  }
  // N: the blocks, the final norm and the LM head (the tied or untied [V, C] matrix); the
  // position table and an untied input embedding are lookups, not products.
  const double n = static_cast<double>(config_.n_layer) * (attn + mlp + 2.0 * norm) +
                   moe_blocks * moe_delta + norm + V * C;
  return 6.0 * n + 12.0 * static_cast<double>(config_.n_layer) * C * static_cast<double>(seq_len);
}

double CausalLm::attention_core_seconds() const noexcept {
  double sum = 0.0;
  for (const CausalSelfAttention* a : attention_) sum += a->core_compute_seconds();
  return sum;
}

}  // namespace meshtrain
