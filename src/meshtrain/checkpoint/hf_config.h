// src/meshtrain/checkpoint/hf_config.h
//
// Hugging Face's config.json of a model, both ways: written beside an export (transformers
// 4.36.2's GPT2Config, LlamaConfig and MixtralConfig names), and checked against the run's
// model.* settings when checkpoint.init_from reads a directory that has one. meshtrain's
// model shape always comes from the run's config; config.json only confirms it, so a mismatch
// the tensors' shapes cannot show (norm epsilon, rotary base, activation, a tied Llama head)
// is named rather than silently trained on.
// Uses: config/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

/// What stops `model` from being a Hugging Face model (empty: nothing): a MoE model with
/// model.moe_layer_freq ≠ 1 (Mixtral has a sparse MoE block in every layer).
std::vector<ConfigIssue> hf_export_issues(const ModelConfig& model);

/// The tokenizer's special ids config.json names (bos_token_id, eos_token_id): GPT-2 50256 for
/// both (as Hugging Face's gpt2 config), SentencePiece its bos and eos pieces; none for the
/// char tokenizer or an unknown one.
struct HfTokenIds {
  std::optional<std::int64_t> bos{};
  std::optional<std::int64_t> eos{};
};

/// Hugging Face's config.json for `model` (model_type gpt2, llama or mixtral: sizes, eps,
/// rope_theta, tie_word_embeddings, torch_dtype float32; mixtral: num_local_experts,
/// num_experts_per_tok, intermediate_size = the expert F, router_aux_loss_coef), as JSON text.
/// bos_token_id / eos_token_id are `ids`', written as null when unknown: GPT2Config's and
/// LlamaConfig's defaults (50256; 1 and 2) would otherwise name ids of another vocabulary, and
/// with null generate() stops only at max_new_tokens. Throws ConfigError for a model with no
/// Hugging Face class (see hf_export_issues).
std::string hf_config_json(const ModelConfig& model, const HfTokenIds& ids = {});

/// A config.json read against the run's model.
struct HfConfigCheck {
  /// One sentence per disagreement, naming the config.json key and value and the model.*
  /// setting and value ("config.json: rope_theta 500000.0, the run has model.rope_theta =
  /// 10000"). Empty when they agree.
  std::vector<std::string> problems;
  /// tie_word_embeddings (absent: GPT2Config's default true, LlamaConfig's false): a tied
  /// Llama's file has no lm_head.weight, and HfImport then starts the untied head from the
  /// embedding.
  bool tied_head = true;
};

/// Reads `file` (Hugging Face config.json) and compares it with `model` (validated): the
/// model_type for the family (and MoE), layers, heads, kv heads, hidden size, MLP size
/// (n_inner / intermediate_size), vocabulary, positions (gpt2: n_positions = block_size;
/// llama: max_position_embeddings ≥ block_size), norm epsilon (relative 1e-6), rope_theta,
/// activation (gelu_new / gelu_pytorch_tanh for gpt2, silu for llama), no attention or MLP bias
/// and no rope_scaling for llama, experts and top-k for mixtral, a tied head and scaled
/// attention (scale_attn_weights, no scale_attn_by_inverse_layer_idx) for gpt2. Keys
/// absent take transformers 4.36.2's defaults. Throws DataError naming the file when it cannot
/// be read or is not a JSON object (at most 1 MB).
HfConfigCheck check_hf_config(const std::filesystem::path& file, const ModelConfig& model);

}  // namespace meshtrain
