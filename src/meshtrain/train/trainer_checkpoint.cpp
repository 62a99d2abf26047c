// Trainer's sharded checkpoints: what a rank saves, how a checkpoint of any layout is loaded,
// and checkpoint.resume. The file format is checkpoint/sharded_checkpoint.h's.
#include <fmt/format.h>

#include <chrono>

#include "meshtrain/checkpoint/training_state.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/train/collective_verdict.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ShardPiece piece_of(const OptimizerShard& s) {
  return {.slice = s.param->shard, .begin = s.begin, .end = s.end};
}

}  // namespace

fs::path Trainer::checkpoint_root() const {
  return fs::path(config_.checkpoint.dir) / "checkpoints";
}

void Trainer::finish_checkpoint() {
  if (!checkpoint_writer_) return;  // the same on every rank: no save was ever started
  const std::string error = checkpoint_writer_->wait();
  const std::string first = first_error(world_, error);
  if (!first.empty()) throw DataError(fmt::format("a checkpoint save failed on {}", first));
  if (world_.rank() == 0 && options_.log && !checkpoint_writer_->last_dir().empty() &&
      !reported_complete_) {
    fmt::print("checkpoint {} complete (written in {:.1f} ms{})\n",
               checkpoint_writer_->last_dir().string(),
               checkpoint_writer_->last_write_seconds() * 1e3,
               config_.checkpoint.async ? " in the background" : "");
  }
  reported_complete_ = true;
}

void Trainer::save_checkpoint(std::int64_t steps_done) {
  const auto start = std::chrono::steady_clock::now();
  if (!checkpoint_writer_) {
    checkpoint_writer_ = std::make_unique<CheckpointWriter>(
        CheckpointWriterOptions{.root = checkpoint_root(),
                                .keep_last = config_.checkpoint.keep_last,
                                .async = config_.checkpoint.async,
                                .finalize_timeout_s = config_.parallel.comm_timeout_s});
  }
  finish_checkpoint();  // a second save waits for the first, everywhere
  on_rank0_for_all(world_, [&] { prepare_checkpoint_dir(checkpoint_root(), steps_done); });
  world_.barrier();  // nobody writes into the directory before rank 0 has cleared it

  const PlacementRanks ranks = placement_groups(*mesh_).ranks();
  RankSnapshot snapshot{.step = steps_done,
                        .rank = world_.rank(),
                        .world = world_.size(),
                        .pieces = {},
                        .state = json::object(),
                        .config_toml = {}};
  const OptimizerShards& shards = optim_->shards();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const OptimizerShard& s = shards[i];
    // One copy of each element (mesh/placement.h).
    if (!s.param->placement.counts_copy(ranks) || s.end == s.begin) continue;
    snapshot.pieces.push_back(
        {.name = s.param->name,
         .piece = piece_of(s),
         .master = s.master.clone(MemCategory::other),
         .exp_avg = optim_->adamw().exp_avg(i).clone(MemCategory::other),
         .exp_avg_sq = optim_->adamw().exp_avg_sq(i).clone(MemCategory::other)});
  }
  if (world_.rank() == 0) {
    std::optional<DynamicLossScaler::State> scaler;
    if (const DynamicLossScaler* s = optim_->loss_scaler()) scaler = s->state();
    snapshot.state = training_state_json(steps_done, optim_->adamw().steps_taken(), scaler,
                                         config_, world_.size());
    snapshot.config_toml = checkpoint_toml(config_);
  }
  checkpoint_writer_->save(std::move(snapshot));
  reported_complete_ = false;
  last_checkpoint_s_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (world_.rank() == 0 && options_.log) {
    fmt::print("checkpoint step {}: training paused {:.1f} ms{}\n", steps_done,
               last_checkpoint_s_ * 1e3,
               config_.checkpoint.async ? " (state copied; written in the background)" : "");
  }
}

void Trainer::stop_for_signal(int sig, std::int64_t steps_done, bool saved) {
  // Who received it, for the message: a user who signalled one rank sees that it was heard.
  const bool mine = stop_signal_received() != 0;
  std::int32_t count = mine ? 1 : 0;
  std::int32_t lowest = mine ? world_.size() - world_.rank() : 0;
  world_.all_reduce_sum(std::span<std::int32_t>(&count, 1));
  world_.all_reduce_max(std::span<std::int32_t>(&lowest, 1));
  Stop stop{.signal = sig,
            .ranks_signalled = count,
            .first_rank = world_.size() - lowest,
            .step = steps_done,
            .checkpoint = {}};
  // checkpoint.dir was checked writable at start-up exactly when one of these is set.
  if (config_.checkpoint.save_final || config_.checkpoint.interval > 0) {
    if (!saved) save_checkpoint(steps_done);
    finish_checkpoint();  // complete (COMPLETE written) on every rank before anyone exits
    stop.checkpoint = checkpoint_writer_->last_dir();
  }
  stopped_ = std::move(stop);
}

void Trainer::load_checkpoint(const fs::path& dir) {
  // Phase 1: every rank reads what it needs into buffers of its own; nothing is changed.
  OptimizerShards& shards = optim_->shards();
  std::vector<Tensor> masters, ms, vs;
  std::string error;
  TrainingState saved_state;
  try {
    CheckpointReader reader(dir);
    const Config saved = reader.config();
    if (const std::string d = model_difference(saved.model, config_.model); !d.empty()) {
      throw DataError(fmt::format(
          "checkpoint {} holds another model ({}); resume with the config it was trained "
          "with, or start without checkpoint.resume",
          dir.string(), d));
    }
    saved_state = parse_training_state(reader.state(), dir);
    for (const OptimizerShard& s : shards) {
      const Shape shape{s.end - s.begin};
      masters.push_back(Tensor::empty(shape, MemCategory::other));
      ms.push_back(Tensor::empty(shape, MemCategory::other));
      vs.push_back(Tensor::empty(shape, MemCategory::other));
      const ShardPiece piece = piece_of(s);
      reader.fill(s.param->name, kMasterField, piece, masters.back().span_f32());
      reader.fill(s.param->name, kExpAvgField, piece, ms.back().span_f32());
      reader.fill(s.param->name, kExpAvgSqField, piece, vs.back().span_f32());
    }
  } catch (const DataError& e) {
    error = e.what();
  } catch (const nlohmann::json::exception& e) {
    error = fmt::format("{}/metadata.json: malformed state: {}", dir.string(), e.what());
  }
  // Phase 2: all ranks agree, then commit.
  if (const std::string first = first_error(world_, error); !first.empty()) {
    throw DataError(first);
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    shards[i].master.copy_from(masters[i]);
    optim_->adamw().exp_avg(i).copy_from(ms[i]);
    optim_->adamw().exp_avg_sq(i).copy_from(vs[i]);
  }
  optim_->adamw().set_steps_taken(saved_state.optimizer_steps);
  if (DynamicLossScaler* scaler = optim_->loss_scaler(); scaler && saved_state.loss_scaler) {
    scaler->restore(*saved_state.loss_scaler);
  }
  optim_->zero()
      .publish_parameters();  // compute copies (16-bit, ZeRO-1/2 full values) from the masters
  const std::int64_t step = saved_state.step;
  const json& mesh = saved_state.mesh;
  start_step_ = step;
  if (world_.rank() == 0 && saved_state.global_batch != global_batch_of(config_)) {
    fmt::print(stderr,
               "meshtrain: warning: the checkpoint was trained with a global batch of {} "
               "sequences, this run uses {}: the data from here on differ from the run that "
               "saved it\n",
               saved_state.global_batch, global_batch_of(config_));
  }
  if (world_.rank() == 0 && step >= config_.training.max_steps) {
    fmt::print(stderr,
               "meshtrain: note: the checkpoint is at step {}, training.max_steps is {}: "
               "nothing left to train (raise training.max_steps to continue)\n",
               step, config_.training.max_steps);
  }
  if (world_.rank() == 0 && options_.log) {
    // Checkpoints from before context (expert) parallel have no "cp" ("ep"): saved at 1.
    fmt::print(
        "resumed from {} at step {} (saved with dp={} cp={} tp={} pp={} v={} zero_stage={} "
        "ep={})\n",
        dir.string(), step, mesh.value("dp", 0), mesh.value("cp", 1), mesh.value("tp", 0),
        mesh.value("pp", 0), mesh.value("virtual_stages", 0), mesh.value("zero_stage", 0),
        mesh.value("ep", 1));
  }
}

void Trainer::resume() {
  const std::string& resume = config_.checkpoint.resume;
  if (resume.empty()) return;
  if (resume != "auto") {
    load_checkpoint(resume);
    return;
  }
  if (world_.rank() == 0) {
    for (const fs::path& dir : remove_incomplete_checkpoints(checkpoint_root())) {
      if (options_.log) {
        fmt::print("checkpoint.resume = auto: removed {}, a save that never completed\n",
                   dir.string());
      }
    }
  }
  const std::vector<fs::path> candidates = complete_checkpoints(checkpoint_root());
  if (candidates.empty()) {
    if (world_.rank() == 0 && options_.log) {
      fmt::print("checkpoint.resume = auto: no complete checkpoint under {}; starting at step 0\n",
                 checkpoint_root().string());
    }
    return;
  }
  std::string errors;
  for (const fs::path& dir : candidates) {
    try {
      load_checkpoint(dir);
      return;
    } catch (const DataError& e) {
      // Every rank got the same verdict; fall back to the previous complete checkpoint.
      if (world_.rank() == 0) {
        fmt::print(stderr, "meshtrain: cannot resume from {}: {}; trying an older checkpoint\n",
                   dir.string(), e.what());
      }
      errors += fmt::format("\n  {}: {}", dir.string(), e.what());
    }
  }
  throw DataError(fmt::format(
      "checkpoint.resume = auto: none of the {} complete checkpoints under {} loads:{}\n  "
      "remove or repair them, or start without checkpoint.resume",
      candidates.size(), checkpoint_root().string(), errors));
}

}  // namespace meshtrain
