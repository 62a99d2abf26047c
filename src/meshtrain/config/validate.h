// src/meshtrain/config/validate.h — every rule a Config must satisfy, as pure functions
// (DESIGN invariant 9): no mesh, no MPI, no allocation, so the trainer calls them before
// anything starts and the planner can call them while searching layouts.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

/// All problems of `config` for a job of `world_size` ranks; empty when it is valid.
std::vector<ConfigIssue> check_config(const Config& config, int world_size);

/// Throws ConfigError(config.source, issues) when check_config finds any.
void validate_or_throw(const Config& config, int world_size);

/// Model-state bytes per parameter on one rank (docs/memory.md): value, gradient, Adam m and
/// v and, under bf16/fp16, the fp32 master, for parallel.zero_stage over parallel.dp ranks —
/// 16 for fp32 ZeRO-0 down to 16/dp for ZeRO-3.
double model_state_bytes_per_parameter(const Config& config);

/// model_state_bytes_per_parameter by category (core/allocator.h's MemCategory): the bytes
/// per parameter element counted as params, grads and optimizer. Their sum is
/// model_state_bytes_per_parameter; the planner (plan/accounting.h) uses the split.
struct ModelStateBytes {
  double params = 0.0;
  double grads = 0.0;
  double optimizer = 0.0;
  double total() const { return params + grads + optimizer; }
};
ModelStateBytes model_state_bytes_by_category(const Config& config);

/// Bytes one rank needs to train `config`, estimated before anything is allocated:
/// model_state_bytes_per_parameter for each parameter this rank holds (matrices and the
/// vocabulary tables divided by tp, norms and positions whole) plus the fp32 activations kept for
/// backward (≈ 10·C + 2·F floats per token per layer, plus embeddings and the logits of the
/// rank's vocabulary shard). An estimate for refusing impossible runs early, not the planner's
/// accounting.
double estimated_training_bytes(const Config& config);

/// A ConfigIssue when estimated_training_bytes exceeds `available_bytes` (skipped when
/// available_bytes ≤ 0, i.e. unknown). Needs model.vocab_size resolved.
std::vector<ConfigIssue> check_memory(const Config& config, std::int64_t available_bytes);

/// Key/value heads: model.n_kv_head, or n_head when it is 0.
std::int64_t kv_heads_of(const ModelConfig& m);

/// MLP hidden size F: model.ffn_hidden, or the family's rule when it is 0 — gpt2: 4·n_embd
/// (Radford et al. 2018); llama: 2/3·4·n_embd rounded up to a multiple of 256 (Touvron et al.
/// 2023, §2.2, and Meta's reference code).
std::int64_t ffn_hidden_of(const ModelConfig& m);

/// Each expert's hidden size F of a MoE model: model.moe_ffn_hidden, or ffn_hidden_of(m) when
/// it is 0.
std::int64_t moe_ffn_hidden_of(const ModelConfig& m);

/// Whether the dp gradient reductions overlap backward: parallel.overlap_grad_reduce, except
/// under zb_h1, whose deferred weight gradients (W passes) are final only after the unit's
/// backward hook has run. Shared by the trainer (ZeroOptions) and the planner (comm buffers).
bool overlap_grad_reduce(const ParallelConfig& p);

/// Sequences per optimizer step: micro_batch × accumulation × dp (training.global_batch, when
/// set, must equal it; check_config enforces that).
std::int64_t global_batch_of(const Config& config);

/// The peak learning rate after the batch-size scaling rule of training.lr_scaling:
/// "linear": lr · B/B₀ (Goyal et al. 2017, §2.1), "sqrt": lr · √(B/B₀) (Krizhevsky 2014, §5;
/// Hoffer et al. 2017), "none": lr; B = global batch, B₀ = training.lr_base_batch.
double scaled_peak_lr(const Config& config);

}  // namespace meshtrain
