// src/meshtrain/plan/presets.h
//
// Model presets for the planner (published architectures, with their sources) and the
// lookup that also accepts the repo's TOML configs. Uses: config (ModelConfig,
// load_config_file), core (errors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain::plan {

/// A model to plan for: its dimensions as a meshtrain ModelConfig (block_size = the sequence
/// length it was trained at; vocab_size set; mixture-of-experts models with model.moe_*).
struct ModelPreset {
  std::string name;
  ModelConfig model;
  std::string source;
};

/// "gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "llama-33b", "mixtral-8x7b".
const std::vector<ModelPreset>& model_presets();

/// A preset by name, or a meshtrain TOML config when `name_or_path` ends in ".toml" (its
/// [model] section; a vocab_size of 0 — taken from the data at training time — becomes 65, the
/// character vocabulary of data/prepared/shakespeare_char, and the preset says so in `source`).
/// Throws ConfigError listing the known presets for an unknown name.
ModelPreset model_from(const std::string& name_or_path);

}  // namespace meshtrain::plan
