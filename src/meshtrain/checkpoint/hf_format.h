// src/meshtrain/checkpoint/hf_format.h
//
// Export and import of one consolidated safetensors file in Hugging Face's layout, so that
// transformers' GPT2LMHeadModel / LlamaForCausalLM load a meshtrain model (and a meshtrain run
// can start from such a file). meshtrain's parameter names already are Hugging Face's; what
// differs is
//   gpt2   HF's Conv1D (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) stores its weight
//          [in, out] (y = x·W + b); meshtrain stores [out, in] (nn.Linear): transposed both
//          ways. c_attn's output columns are [q | k | v] on both sides, so the transpose is the
//          whole mapping. The LM head is tied and not in the file (HF GPT-2 files omit
//          lm_head.weight). HF GPT-2 always has biases: a model.bias = false export writes
//          zero biases (the same function), and an import into such a model accepts them only
//          when they are all zero.
//   llama  names and layouts equal (nn.Linear everywhere, untied lm_head.weight). meshtrain's
//          RoPE pairs the two halves of each head (HF's rotate_half), so q_proj / k_proj need
//          no permutation (tests/reference/gpt_reference.py pins the convention).
//   MoE    a llama with model.moe_experts > 0 is Hugging Face's MixtralForCausalLM: the same
//          names and layouts, each block's feed-forward being block_sparse_moe.gate.weight
//          [E, C] and block_sparse_moe.experts.{j}.w1/w3 [F, C], w2 [C, F] (meshtrain's names).
//          Mixtral has a MoE block in every layer: model.moe_layer_freq ≠ 1 does not export
//          (ConfigError). config.json is transformers 4.36.2's MixtralConfig.
// Exported tensors are F32 and logical (no tp padding, gpt2's tied embedding once). The file's
// metadata is {"format": "pt"} (transformers refuses safetensors without it) plus
// "meshtrain_format": "hf-export-v1".
// Uses: checkpoint/safetensors.h, hf_weights.h, hf_config.h, model/ (the parameter table of a
// config), config/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/hf_config.h"
#include "meshtrain/checkpoint/hf_weights.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/config/config.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// One tensor of a Hugging Face file for a model config.
struct HfTensor {
  std::string hf_name;      // the name in the file
  std::string name;         // meshtrain's parameter name; empty for a zero bias (gpt2, no bias)
  Shape shape;              // meshtrain's logical shape ([out, in] for a weight)
  bool transposed = false;  // stored [in, out] in the file (gpt2 Conv1D weights)

  /// The shape in the file.
  Shape hf_shape() const;
};

/// Every tensor of the Hugging Face file of `model` (validated config, vocab_size > 0), in
/// meshtrain's parameter order (the zero biases of a bias-free gpt2 where HF has them).
std::vector<HfTensor> hf_tensors(const ModelConfig& model);

/// meshtrain logical tensor (f32, spec.shape) → the file's layout (f32, spec.hf_shape()), and
/// back. A copy either way (transposed when spec.transposed); MT_CHECKs the shape.
Tensor to_hf(const Tensor& logical, const HfTensor& spec);
Tensor from_hf(const Tensor& stored, const HfTensor& spec);

/// Writes `out` (safetensors, HF names and layouts, F32) and `out`'s directory/config.json,
/// each atomically (temporary name, fsync, rename). `logical`: every logical parameter of
/// config.model under meshtrain's names, [out, in] (Trainer::logical_tensors(), or
/// load_logical_model). Throws DataError naming the tensor for a missing or extra tensor, a
/// shape other than the model's, a non-finite value, or a file that cannot be written, and
/// ConfigError for a model with no Hugging Face class (see hf_config_json); nothing is written
/// then. `ids`: config.json's bos_token_id / eos_token_id (hf_config_json).
void export_hf(const std::vector<NamedTensor>& logical, const Config& config,
               const std::filesystem::path& out, const HfTokenIds& ids = {});

/// A trained model as logical tensors: its resolved config and every parameter under
/// meshtrain's names, [out, in], no padding.
struct LogicalModel {
  Config config;
  std::vector<NamedTensor> tensors;
};

/// Reads a checkpoint directory into logical tensors: a run's final checkpoint (config.toml +
/// model.safetensors, see model_checkpoint.h) or a sharded one (checkpoints/step-N, assembled
/// from its pieces by CheckpointReader, checksums verified). Throws DataError naming the path
/// for a missing directory or file, a corrupt or incomplete checkpoint, or a NaN or infinity
/// in a tensor (the tensor and the element named, finite_values.h); ConfigError for a bad
/// config.toml.
LogicalModel load_logical_model(const std::filesystem::path& dir);

/// A Hugging Face model opened to initialise a model from (checkpoint.init_from): one
/// safetensors file, a sharded model's index, or a directory holding either (hf_weights.h).
/// Reads the headers (and config.json beside them, if any) only; tensors are read one at a time
/// when asked for, F32 as stored, BF16 and F16 widened exactly to f32.
class HfImport {
 public:
  /// Opens `path` and checks it against `model` (validated, vocab_size known): every tensor of
  /// hf_tensors(model) present (gpt2: "transformer." may be missing from every name, as in
  /// OpenAI's original GPT-2 files; a bias-free model's zero biases may be absent; llama: a
  /// missing lm_head.weight is taken from model.embed_tokens.weight when config.json says
  /// tie_word_embeddings = true), each of its shape and F32, BF16 or F16, and nothing else but
  /// HF's non-parameter buffers (attn.bias, attn.masked_bias, rotary_emb.inv_freq: ignored)
  /// and gpt2's tied lm_head.weight; a config.json beside the file(s) agreeing with `model`
  /// (check_hf_config); a Mixtral (MoE) file into a dense model, a dense file into a MoE model,
  /// or another number of experts is named as such first. Throws DataError naming the file,
  /// the tensor and both shapes (every problem, the first 8 listed), or any DataError of
  /// open_hf_weights. Reads no tensor data.
  HfImport(const std::filesystem::path& path, const ModelConfig& model);

  /// Reads every tensor once and throws DataError naming the file and tensor for a non-finite
  /// value, or a non-zero bias of a bias-free gpt2. Peak memory: one tensor.
  void check_values() const;

  /// out [end − begin] ← elements [begin, end) of p's flattened local tensor (its tp shard;
  /// padding zero), from the file's tensor of p.name in meshtrain's layout. Reads that tensor
  /// unless it was the last one read. MT_CHECKs that p is a parameter of the model (the
  /// constructor validated the file).
  void fill(const Parameter& p, std::int64_t begin, std::int64_t end, float* out);

  const std::filesystem::path& path() const noexcept { return weights_.source; }
  /// One line for the log: tensors, dtypes, shards, ignored buffers, a tied Llama head, and
  /// whether a config.json was checked.
  std::string summary() const;

 private:
  // Maps each spec to its file tensor (file_name_), appending a sentence per problem.
  void match_tensors(const ModelConfig& model, bool tied_head, std::vector<std::string>& problems);
  Tensor logical(const HfTensor& spec) const;

  HfWeights weights_;
  std::vector<HfTensor> specs_;
  std::map<std::string, std::string> file_name_;  // spec.hf_name → name in the file
  std::set<std::string> dtypes_;                  // of the tensors used
  std::int64_t ignored_buffers_ = 0;
  bool head_from_embedding_ = false;
  bool config_checked_ = false;
  std::string cached_name_;
  Tensor cached_;
};

}  // namespace meshtrain
