// src/meshtrain/checkpoint/model_checkpoint.h
//
// The final checkpoint of a run: `model.safetensors` (every logical parameter under its Hugging
// Face name, [out, in] layout, gathered over tp without padding; gpt2's tied LM head is stored
// once as transformer.wte.weight),
// `config.toml` (the resolved config), `meta.json` (the tokenizer, copied from the data
// directory) and the tokenizer's files that meta.json lists (encoder.json + vocab.bpe,
// tokenizer.model; data/metadata.h). Written by rank 0 after training; enough for `meshtrain
// sample`. Sharded, resumable checkpoints with optimizer state: sharded_checkpoint.h.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/config/config.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// Creates `dir` if needed and writes the files atomically (each to a temporary name,
/// then renamed); `tensors` are the logical parameters. An empty `meta_json` (data without a
/// meta.json: nanoGPT's or llm.c's token files) writes no meta.json and no tokenizer file.
/// Throws DataError when a file cannot be written.
void save_model_checkpoint(const std::filesystem::path& dir,
                           const std::vector<NamedTensor>& tensors, const Config& config,
                           const std::filesystem::path& meta_json);

/// Sets every parameter of `params` (any tp shard; padding zero) from `logical`, the logical
/// tensors of a checkpoint by name (load_logical_model, hf_format.h: a final or a sharded
/// checkpoint); tensors that are not parameters are ignored. Throws DataError naming `source`
/// (the checkpoint) and the parameter for a missing parameter, a shape that differs from the
/// model's logical shape, or a non-finite value (finite_values.h); parameters before the
/// culprit are already set then.
void load_model_parameters(const std::vector<NamedTensor>& logical, std::string_view source,
                           const ParameterList& params);

}  // namespace meshtrain
