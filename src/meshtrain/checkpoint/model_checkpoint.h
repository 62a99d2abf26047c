// src/meshtrain/checkpoint/model_checkpoint.h
//
// The final checkpoint of a run: `model.safetensors` (every logical parameter under its Hugging
// Face name, [out, in] layout, gathered over tp without padding; gpt2's tied LM head is stored
// once as transformer.wte.weight),
// `config.toml` (the resolved config), `meta.json` (the tokenizer, copied from the data
// directory) and the tokenizer's files that meta.json lists (encoder.json + vocab.bpe,
// tokenizer.model; data/metadata.h). Written by rank 0 after training; enough for `meshtrain
// sample`. Sharded, resumable checkpoints with optimizer state are a later issue.
#pragma once

#include <filesystem>

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

/// Copies the tensors of `dir`/model.safetensors into `params` (by name; whole parameters,
/// tp = 1). Throws DataError for
/// a missing file, a missing parameter, a shape that differs from the model's, or a
/// non-finite value.
void load_model_parameters(const std::filesystem::path& dir, const ParameterList& params);

}  // namespace meshtrain
