// src/meshtrain/checkpoint/training_state.h — the "state" object of a sharded checkpoint's
// metadata.json (docs/checkpointing.md): everything besides the tensors that a resumed run
// needs to continue exactly — the step, the optimizer's step count and hyper-parameters, the LR
// schedule's position, the fp16 loss scaler, the sampler's position and the layout it was saved
// with. One schema, written by save and read by resume, so the two cannot drift apart.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "meshtrain/config/config.h"
#include "meshtrain/optim/loss_scaler.h"

namespace meshtrain {

/// What a resume reads back of the "state" object.
struct TrainingState {
  std::int64_t step = 0;             // optimizer steps done (the next step's index)
  std::int64_t optimizer_steps = 0;  // AdamW's bias-correction t (≤ step: skipped steps)
  std::optional<DynamicLossScaler::State> loss_scaler;  // fp16 only
  std::int64_t global_batch = 0;     // sequences per step it was trained with
  nlohmann::json mesh;               // checkpoint_mesh_json of the saving layout
};

/// The "state" object of a run of `config` over `world` ranks after `step` steps, of which
/// `optimizer_steps` stepped AdamW, with its fp16 `loss_scaler` (none otherwise). The rest —
/// hyper-parameters, the layout, the counter-based generators' positions — follows from the
/// config and the step (core/rng.h, data/sampler.h, the LR schedule).
nlohmann::json training_state_json(std::int64_t step, std::int64_t optimizer_steps,
                                   const std::optional<DynamicLossScaler::State>& loss_scaler,
                                   const Config& config, int world);

/// Reads a "state" object of checkpoint `dir` (for messages). Throws DataError naming the file
/// when a field is missing, has the wrong type, or the steps are not a state training can
/// reach (negative, or more optimizer steps than steps).
TrainingState parse_training_state(const nlohmann::json& state, const std::filesystem::path& dir);

}  // namespace meshtrain
