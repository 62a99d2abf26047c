// src/meshtrain/train/trainer.h
//
// The Trainer: config → checks → data → mesh → model → optimizer → loop. One optimizer step is
// `accumulation` micro-batches of forward/backward on every dp rank (its tp ranks share each
// micro-batch), the gradients' reduction over dp (all-reduce, or reduce-scatter under ZeRO;
// parallel/dp/zero.h), under sequence parallelism one all-reduce over tp of the replicated
// parameters' partial gradients, the global grad norm, clipping, the LR of the schedule and
// AdamW on this rank's fp32 master slices, then (ZeRO-1/2) the all-gather of the parameters.
// Uses: every runtime module below it. Knows nothing of argv (apps/ parses the command line).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/config/config.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/monitor/watchdog.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/parallel/dp/zero.h"
#include "meshtrain/parallel/pp/executor.h"
#include "meshtrain/train/comm_monitors.h"
#include "meshtrain/train/fault_injector.h"
#include "meshtrain/train/model_stage.h"
#include "meshtrain/train/optimizer_state.h"
#include "meshtrain/train/reporting.h"
#include "meshtrain/train/step_trace.h"
#include "meshtrain/train/train_data.h"
#include "meshtrain/train/trainer_options.h"

namespace meshtrain {

class Trainer {
 public:
  /// Checks the config against `world` (ConfigError, before any allocation), opens the data
  /// (DataError for a missing or corrupt file), then builds the mesh, this rank's pipeline
  /// stage of the model and the optimizer. Collective over `world`.
  Trainer(Config config, ProcessGroup& world, TrainerOptions options = {});
  Trainer(const Trainer&) = delete;  // its parts refer to its config and to each other
  Trainer& operator=(const Trainer&) = delete;

  /// Trains training.max_steps steps; returns every step's metrics (same on every rank except
  /// peak_bytes). Saves the final checkpoint (logical tensors, gathered over tp) on rank 0
  /// when checkpoint.save_final. After every step the ranks agree (one all-reduce) whether
  /// any of them received a stop signal (core/stop_signal.h); if one did, every rank stops
  /// after that same step, a sharded checkpoint of it is written and completed (when
  /// checkpoint.save_final or checkpoint.interval > 0; not the final consolidated one), and
  /// run() returns early with stopped() set.
  std::vector<StepMetrics> run();

  /// Why run() ended before training.max_steps was trained out: a stop signal.
  struct Stop {
    int signal = 0;                    // the highest signal number a rank received
    int ranks_signalled = 0;           // how many ranks had received one when they stopped
    int first_rank = 0;                // the lowest world rank of those
    std::int64_t step = 0;             // optimizer steps done (1-based step it stopped after)
    std::filesystem::path checkpoint;  // the complete checkpoint of that step; "" = none
  };
  /// Set by run() when it stopped for a signal (the same on every rank); empty otherwise.
  const std::optional<Stop>& stopped() const noexcept { return stopped_; }

  struct Gradients {
    double loss = 0.0;       // mean over the global batch
    double grad_norm = 0.0;  // before clipping (NaN for a skipped step)
    bool skipped = false;    // fp16: a gradient overflowed on some rank; the step is skipped
  };
  /// Step `step` (0-based) up to the averaged gradients: the pipeline schedule's forward and
  /// backward of every micro-batch (pp = 1: one after the other), the sum of the tied
  /// embedding's two copies (gpt2 over stages), the tp sum of replicated gradients (sequence
  /// parallel) and the dp reduction (ZeRO stage: all-reduce or reduce-scatter). The
  /// optimizer shards' grads (zero().shards()) hold the global-batch gradient after,
  /// unscaled; under fp16 an overflow anywhere marks the step skipped (same on every rank)
  /// and updates the loss scale.
  Gradients compute_gradients(std::int64_t step);
  /// Clips with `grad_norm`, applies AdamW at the step's LR, publishes the parameters (ZeRO),
  /// zeroes the gradients; returns lr. After a skipped step only zeroes the gradients.
  double apply_update(std::int64_t step, double grad_norm);
  /// Mean val loss over training.eval_batches global batches (same on every rank).
  double evaluate();

  /// Sharded checkpoint of the state after `steps_done` optimizer steps
  /// (checkpoint/sharded_checkpoint.h) under <checkpoint.dir>/checkpoints: waits for the
  /// previous save, copies this rank's pieces — fp32 master slices and AdamW moments of the
  /// parameters it updates; under ZeRO-0 only dp rank 0 writes, parameters replicated over tp
  /// only tp rank 0 — and writes them (in the background when checkpoint.async). Collective
  /// over the world. Throws DataError on every rank when a previous save failed on any rank.
  void save_checkpoint(std::int64_t steps_done);
  /// Waits until this rank's last save is written (rank 0: COMPLETE); DataError on every rank
  /// when any rank's failed. Collective over the world.
  void finish_checkpoint();
  /// Loads a checkpoint written under any layout into this one (resharding): master weights,
  /// moments, optimizer step count, loss scaler; then the first step run() takes is its step.
  /// Every rank reads what it needs and the ranks agree before anything is changed, so a bad
  /// file leaves the model untouched. Throws DataError on every rank (naming the file) for a
  /// corrupt, incomplete or foreign checkpoint. Collective over the world.
  void load_checkpoint(const std::filesystem::path& dir);
  /// The step run() starts from: 0, or the step of the checkpoint resumed from.
  std::int64_t start_step() const noexcept { return start_step_; }

  /// This rank's parameters (its pipeline stage's chunks, its tp shards).
  const ParameterList& parameters() const { return model_->stage().parameters(); }
  PipelineStage& stage() { return model_->stage(); }
  /// Parameters of the whole logical model (every stage, no padding, tied weights once).
  std::int64_t logical_parameters() const { return model_->logical_parameters(); }
  const pp::PipelineExecutor& executor() const { return model_->executor(); }
  /// Where parameters, master weights and gradients live (parallel.zero_stage).
  ZeroSharding& zero() { return optim_->zero(); }
  /// fp16 only; nullptr otherwise.
  const DynamicLossScaler* loss_scaler() const { return optim_->loss_scaler(); }
  const DeviceMesh& mesh() const { return *mesh_; }
  const Config& config() const { return config_; }
  const data::Metadata& metadata() const { return data_->metadata(); }
  /// Every logical parameter of the model (all stages, tp shards gathered without padding, the
  /// fp32 masters gathered over dp under ZeRO, gpt2's tied embedding once, every expert of a
  /// MoE model), meshtrain names, [out, in], f32, MemCategory::other, on every rank (each ep
  /// rank broadcasts its experts over ep, then each stage its tensors over pp).
  /// Collective over tp, dp, ep and pp: every rank calls it. The source of the final
  /// checkpoint and of `meshtrain export`'s tensors.
  std::vector<NamedTensor> logical_tensors();

 private:
  StepMetrics train_step(std::int64_t step);
  /// The highest stop signal any rank has received (0 = none): one all-reduce over the world,
  /// so every rank gets the same answer at the same step boundary. Collective over the world.
  int agreed_stop_signal();
  /// After an agreed stop signal `sig` at `steps_done`: writes the sharded checkpoint of that
  /// step (unless `saved`: the interval's save already did), waits until it is complete and
  /// sets stopped_. Collective over the world.
  void stop_for_signal(int sig, std::int64_t steps_done, bool saved);
  /// checkpoint.resume: "auto" tries the complete checkpoints newest first (a bad one is
  /// reported and the previous one tried); a directory must load.
  void resume();
  std::filesystem::path checkpoint_root() const;

  // The parts; the constructor builds them in this order, except the watchdog (first after
  // the fault injector).
  Config config_;
  TrainerOptions options_;
  ProcessGroup& world_;
  // Attached to world_ first of all, before any collective; declared before every part that
  // holds a group, so that it outlives them all.
  std::unique_ptr<CommMonitors> monitors_;
  std::unique_ptr<FaultInjector> faults_;  // [fault_injection]; built once the config is valid
  std::unique_ptr<TrainData> data_;
  std::unique_ptr<DeviceMesh> mesh_;
  // Started in the constructor before the first collective on world_; declared after mesh_
  // so that it stops once every part that communicates is gone, before the groups are freed.
  std::unique_ptr<WatchdogScope> watchdog_;
  int threads_ = 1;  // compute threads of this rank (MFU counts their peak)
  std::unique_ptr<ModelStage> model_;
  std::unique_ptr<OptimizerState> optim_;
  std::unique_ptr<Reporting> report_;
  std::unique_ptr<StepTrace> trace_;  // --trace
  // Sharded checkpoints (trainer_checkpoint.cpp).
  std::unique_ptr<CheckpointWriter> checkpoint_writer_;  // from the first save on
  std::int64_t start_step_ = 0;
  bool reported_complete_ = true;   // the last save's completion was logged
  double last_checkpoint_s_ = 0.0;  // the training thread's time in the last save_checkpoint
  std::optional<Stop> stopped_;     // run() stopped for a signal
};

}  // namespace meshtrain
