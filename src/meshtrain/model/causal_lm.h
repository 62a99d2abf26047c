// src/meshtrain/model/causal_lm.h
//
// A decoder-only language model of one of two families, built for one rank of a tensor-
// parallel group (tp = 1: the whole model; one code path):
//   gpt2 (Radford et al. 2019): learned token and position embeddings, pre-LayerNorm blocks
//     with GELU MLPs, final LayerNorm, LM head tied to the token embedding. Hugging Face
//     GPT-2 names (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...).
//   llama (Touvron et al. 2023): token embedding, pre-RMSNorm blocks with rotary grouped-query
//     attention and SwiGLU MLPs, final RMSNorm, untied LM head. Hugging Face Llama names
//     (model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, lm_head.weight, ...).
// Weights are in nn.Linear layout [out, in] (HF GPT-2's Conv1D stores [in, out]: an exporter
// transposes, the model never does). The loss is the mean softmax cross-entropy over all
// tokens, computed vocabulary-parallel.
//
// Under pipeline parallelism one object holds one model chunk (ChunkLayout): a run of blocks,
// plus the embeddings when it is the first chunk of the model and the final norm, LM head and
// loss when it is the last. For gpt2 split over stages the last chunk holds its own copy of
// the tied token embedding (same name, same initial values; its placement record is the tied copy); the trainer
// sums the two copies' gradients each step so they stay identical.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/module.h"
#include "meshtrain/layers/parameter_hooks.h"
#include "meshtrain/mesh/placement.h"
#include "meshtrain/parallel/tp/vocab_parallel.h"
#include "meshtrain/transformer/moe.h"
#include "meshtrain/transformer/parallel_groups.h"
#include "meshtrain/transformer/transformer_block.h"

namespace meshtrain {

class CausalSelfAttention;

/// Which part of the model a CausalLm holds: blocks [first_layer, first_layer + num_layers),
/// the embeddings when has_embedding (the first chunk), the final norm and LM head when
/// has_head (the last chunk). num_layers = -1: every layer (a whole model).
struct ChunkLayout {
  std::int64_t first_layer = 0;
  std::int64_t num_layers = -1;
  bool has_embedding = true;
  bool has_head = true;
};

/// A MoE feed-forward and the (global) index of the block that holds it.
struct MoeLayerRef {
  std::int64_t layer;
  SparseMoeBlock* block;
};

class CausalLm {
 public:
  /// Builds and allocates this rank's parameters of `layout` (config validated and
  /// vocab_size > 0 beforehand), each layer from its parameters' records in `records` (the
  /// placement table of the run, mesh/placement.h: the tp slices, the ep rank's experts,
  /// whether there are biases; tied_copy for gpt2's head on a later chunk than the embedding),
  /// and initialises them from (seed, name, global index):
  /// N(0, init_std²) for weights and embeddings; for gpt2 N(0, (init_std/√(2·n_layer))²) for
  /// the residual projections c_proj (GPT-2 §2.3); zeros for biases, ones for norm weights.
  /// `recompute` (training.recompute): selective, every attention recomputes its core in
  /// backward (CausalSelfAttention); full, every block keeps only its input and recomputes
  /// itself (TransformerBlock). `storage` deferred: the parameters get neither values nor
  /// gradients (ZeRO-3 materialises each rank's slice; a parameter table needs none).
  CausalLm(const ModelConfig& config, std::uint64_t seed, const ParallelGroups& groups,
           const PlacementTable& records, const ChunkLayout& layout,
           RecomputeMode recompute = RecomputeMode::none,
           ParameterStorage storage = ParameterStorage::allocated);
  /// The whole model, from the table of one pipeline stage on the groups' tp, cp and ep sizes
  /// (tp's sequence parallelism included; dp = ep, no ZeRO, f32).
  CausalLm(const ModelConfig& config, std::uint64_t seed, const ParallelGroups& groups,
           RecomputeMode recompute = RecomputeMode::none,
           ParameterStorage storage = ParameterStorage::allocated);

  /// tokens, targets [batch, T] i32 (T ≤ block_size; the same on every tp rank; under context
  /// parallelism T is the local length T/cp and the rows are this cp rank's zigzag share) → mean
  /// cross-entropy over batch·T tokens, the same on every tp rank. Keeps what backward needs
  /// in activation slot ctx.slot (micro_batch_context.h; {} for one micro-batch at a time).
  float forward(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t batch,
                std::int64_t seq_len, const MicroBatchContext& ctx);
  /// Backward of `loss_scale` × slot ctx.slot's forward loss: gradients are ACCUMULATED into
  /// every Parameter::grad (pass 1/accumulation for gradient accumulation; the matmul weights'
  /// are queued instead when ctx names a weight-gradient queue). Under sequence parallelism
  /// the gradients of parameters replicated over tp are partial sums over this rank's tokens;
  /// the trainer sums them over tp once per step.
  void backward(float loss_scale, const MicroBatchContext& ctx);
  /// tokens [batch, T] → logits [batch·T, vocab] (gathered over tp; nothing kept for backward
  /// beyond what a forward in slot ctx.slot keeps). Whole models only.
  Tensor logits(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len,
                const MicroBatchContext& ctx);

  // One chunk of a pipeline, one micro-batch (the layers keep its activations in activation
  // slot ctx.slot). `x` and the returned activations are [batch·T, C], or [batch·T/tp, C]
  // under sequence parallelism: the residual stream between chunks.
  /// tokens [batch·T] when has_embedding (x ignored), else x = the previous chunk's output →
  /// the residual stream after this chunk's blocks.
  Tensor forward_blocks(const std::int32_t* tokens, const Tensor& x, std::int64_t batch,
                        std::int64_t seq_len, const MicroBatchContext& ctx);
  /// has_head: residual stream h, targets [batch·T] → mean loss (final norm, head, loss).
  float forward_head(const Tensor& h, const std::int32_t* targets, const MicroBatchContext& ctx);
  /// has_head: backward of loss_scale × the loss → dh.
  Tensor backward_head(float loss_scale, const MicroBatchContext& ctx);
  /// dh (this chunk's output gradient) → the input gradient to send to the previous chunk, or
  /// an empty tensor when has_embedding (the embeddings' gradients are accumulated instead).
  Tensor backward_blocks(const Tensor& dh, const MicroBatchContext& ctx);
  const ChunkLayout& layout() const noexcept { return layout_; }
  /// Drops everything slot ctx.slot's forward kept, in every layer of this chunk (evaluation:
  /// a forward with no backward must not hold its activations).
  void discard(const MicroBatchContext& ctx);

  /// This rank's parameters, each once (gpt2's tied head is transformer.wte.weight), in
  /// construction order: embeddings, blocks 0 …, final norm, (llama) lm_head.
  const ParameterList& parameters() const noexcept { return params_; }
  /// Zeroes every gradient this rank holds (a gradient freed by a sharding scheme's hooks is
  /// skipped).
  void zero_grad();
  /// The parameter units in forward order: the embeddings (first chunk), one per block, the
  /// final norm with the LM head (last chunk). gpt2's tied embedding is in the first and the
  /// last unit of a whole model. Every parameter is in at least one unit.
  const std::vector<ParameterList>& units() const noexcept { return units_; }
  /// The MoE feed-forwards of this chunk's blocks, in block order (empty: a dense model).
  const std::vector<MoeLayerRef>& moe_layers() const noexcept { return moe_; }
  /// Σ over this chunk's attention layers of their core's kernel seconds so far
  /// (CausalSelfAttention::core_compute_seconds).
  double attention_core_seconds() const noexcept;
  /// Called around every unit from now on (nullptr: none). The hooks must outlive the model's
  /// use of them.
  void set_hooks(ParameterHooks* hooks) noexcept { hooks_ = hooks; }
  const ModelConfig& config() const noexcept { return config_; }
  /// 6·N + 12·n_layer·C·T FLOPs per token for forward+backward (Kaplan et al. 2020, §2.1, with
  /// the attention term as PaLM, Chowdhery et al. 2022, App. B); N = logical parameters that
  /// take part in a matrix product (no position table, no untied input embedding).
  double flops_per_token(std::int64_t seq_len) const;

 private:
  Tensor hidden(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq_len);
  void before_forward(int unit);
  void after_forward(int unit);
  void before_backward(int unit);
  void after_backward(int unit);

  ModelConfig config_;
  TensorParallel tp_;
  ContextParallel cp_;
  ChunkLayout layout_;
  std::unique_ptr<VocabParallelEmbedding> embed_;
  std::optional<Parameter> wpe_;  // gpt2: [block_size, C], replicated over tp
  std::vector<std::unique_ptr<TransformerBlock>> blocks_;
  std::vector<MoeLayerRef> moe_;  // the MoE feed-forwards inside blocks_
  std::vector<const CausalSelfAttention*> attention_;  // the attention layers inside blocks_
  std::unique_ptr<Module> final_norm_;
  std::optional<Parameter> lm_head_;  // llama: [V, C]; gpt2 on a later stage: the tied copy
  std::unique_ptr<VocabParallelLmHead> head_;
  ParameterList params_;
  std::vector<ParameterList> units_;
  int first_block_unit_ = 0;  // units_ index of blocks_[0]
  ParameterHooks* hooks_ = nullptr;

  // Kept between forward and backward, per activation slot (micro-batch).
  struct State {
    std::vector<std::int32_t> positions;  // this rank's rows (gpt2)
    SequenceBatch batch{0, 0};
    bool forwarded = false;
  };
  Saved<State> saved_;
};

}  // namespace meshtrain
