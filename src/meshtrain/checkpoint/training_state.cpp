#include "meshtrain/checkpoint/training_state.h"

#include <fmt/format.h>

#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

using nlohmann::json;

json training_state_json(std::int64_t step, std::int64_t optimizer_steps,
                         const std::optional<DynamicLossScaler::State>& loss_scaler,
                         const Config& config, int world) {
  const TrainingConfig& t = config.training;
  json rng = json::array();
  for (int r = 0; r < world; ++r) {
    // Counter-based Philox (core/rng.h): a rank's draws are a function of (seed, stream,
    // index) with the index derived from the step, so (seed, next step) is its whole state.
    rng.push_back({{"rank", r}, {"seed", t.seed}, {"next_step", step}});
  }
  json out = {
      {"step", step},
      {"mesh", checkpoint_mesh_json(config.parallel, world)},
      {"optimizer",
       {{"name", "adamw"},
        {"steps_taken", optimizer_steps},
        {"beta1", t.beta1},
        {"beta2", t.beta2},
        {"eps", t.eps},
        {"weight_decay", t.weight_decay}}},
      // The LR is a pure function of the step (lr_at), so the next step is its state.
      {"lr_scheduler",
       {{"name", "warmup_cosine"}, {"next_step", step}, {"peak_lr", scaled_peak_lr(config)}}},
      {"loss_scaler", nullptr},
      // The sampler draws global batch s from (seed, s) alone (data/sampler.h).
      {"data",
       {{"sampler", "philox_global_batch"},
        {"seed", t.seed},
        {"next_step", step},
        {"global_batch", global_batch_of(config)}}},
      {"rng", {{"generator", "Philox4x32-10 (counter-based)"}, {"ranks", rng}}}};
  if (const auto& s = loss_scaler) {
    out["loss_scaler"] = {{"scale", s->scale},
                          {"clean_steps", s->clean_steps},
                          {"hysteresis_left", s->hysteresis_left},
                          {"skipped", s->skipped}};
  }
  return out;
}

TrainingState parse_training_state(const json& state, const std::filesystem::path& dir) {
  try {
    TrainingState out;
    out.step = state.at("step").get<std::int64_t>();
    out.optimizer_steps = state.at("optimizer").at("steps_taken").get<std::int64_t>();
    if (out.step < 0 || out.optimizer_steps < 0 || out.optimizer_steps > out.step) {
      throw DataError(
          fmt::format("{}/metadata.json: step {} with {} optimizer steps taken is "
                      "not a state training can reach",
                      dir.string(), out.step, out.optimizer_steps));
    }
    out.global_batch = state.at("data").at("global_batch").get<std::int64_t>();
    out.mesh = state.at("mesh");
    if (const json& s = state.at("loss_scaler"); !s.is_null()) {
      out.loss_scaler =
          DynamicLossScaler::State{.scale = s.at("scale").get<double>(),
                                   .clean_steps = s.at("clean_steps").get<std::int64_t>(),
                                   .hysteresis_left = s.at("hysteresis_left").get<std::int64_t>(),
                                   .skipped = s.at("skipped").get<std::int64_t>()};
    }
    return out;
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}/metadata.json: malformed state: {}", dir.string(), e.what()));
  }
}

}  // namespace meshtrain
