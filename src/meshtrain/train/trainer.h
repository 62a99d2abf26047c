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

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/comm/watchdog.h"
#include "meshtrain/config/config.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/data/token_file.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/parallel/dp/zero.h"
#include "meshtrain/parallel/pp/executor.h"
#include "meshtrain/parallel/tp/replicated_grads.h"
#include "meshtrain/train/stage_runner.h"
#include "meshtrain/train/straggler.h"

namespace meshtrain {

struct StepMetrics {
  std::int64_t step = 0;  // optimizer steps done, 1-based
  double loss = 0.0;      // mean train loss of the global batch
  double lr = 0.0;
  double grad_norm = 0.0;  // global, before clipping
  double step_time_s = 0.0;
  double tokens_per_s = 0.0;    // global batch tokens / step time
  double mfu = 0.0;             // model FLOP/s utilisation against training.peak_flops_per_core
  std::int64_t peak_bytes = 0;  // this rank's tracked-allocator peak, all categories
  // Bytes this rank handed to collectives during the step (training only, not evaluation),
  // per group, counted as ProcessGroup's counters define them (all-gather: the input).
  std::int64_t tp_comm_bytes = 0;
  std::int64_t dp_comm_bytes = 0;
  // Context parallel: K/V (ring) or all-to-all (Ulysses) bytes of the cp group.
  std::int64_t cp_comm_bytes = 0;
  // Seconds this rank spent inside those collectives (waiting for peers included).
  double tp_comm_s = 0.0;
  double dp_comm_s = 0.0;
  double cp_comm_s = 0.0;
  // Seconds in the attention core's kernels during the step (forward, backward, recompute;
  // not evaluation): cp_comm_s / attention_s is the share of attention time spent waiting
  // for K/V (p2p) or all-to-alls (a2a) that the compute did not hide.
  double attention_s = 0.0;
  // Pipeline (pp > 1): idle fraction of this step's schedule, measured per stage as
  // 1 − (time in compute actions) / (the longest stage's action-list time), averaged over the
  // pp ranks.
  double bubble = 0.0;
  // fp16: the loss scale this step's backward used, and whether the step was skipped because a
  // gradient overflowed on some rank (every rank skips it). 1 and false otherwise.
  double loss_scale = 1.0;
  bool skipped = false;
  // Straggler report, on the steps that end a training.straggler_interval window (same on
  // every rank): the ranks named, with their slow phase.
  // Seconds the training thread spent saving a sharded checkpoint after this step (0 when
  // none was saved): waiting for the previous save, copying the state, and under
  // checkpoint.async = false writing it.
  double checkpoint_s = 0.0;
  bool straggler_report = false;
  std::vector<Straggler> stragglers;
  std::optional<double> val_loss;
};

struct TrainerOptions {
  std::string metrics_path;  // JSON lines on rank 0; empty = none
  std::string trace_path;    // Chrome-trace JSON of the pipeline actions (rank 0); empty = none
  int trace_steps = 10;      // steps recorded in the trace (the first ones)
  bool log = true;           // one line per log_interval steps on rank 0
  int local_ranks = 1;       // ranks of this job on this node (they share its cores)
  // Test hook: world rank `inject_inf_rank` writes `inject_value` (inf, or NaN) into its first
  // gradient element at step `inject_inf_step` (0-based; −1 = never), after the reductions,
  // before the checks.
  std::int64_t inject_inf_step = -1;
  int inject_inf_rank = 0;
  float inject_value = std::numeric_limits<float>::infinity();
  // Test hook: world rank `slow_rank` (−1 = none) sleeps `slow_seconds` at the start of every
  // call of `slow_phase` (forward or backward), to be named by the straggler report.
  int slow_rank = -1;
  Phase slow_phase = Phase::backward;
  double slow_seconds = 0.0;
};

class Trainer {
 public:
  /// Checks the config against `world` (ConfigError, before any allocation), opens the data
  /// (DataError for a missing or corrupt file), then builds the mesh, this rank's pipeline
  /// stage of the model and the optimizer. Collective over `world`.
  Trainer(Config config, ProcessGroup& world, TrainerOptions options = {});

  /// Trains training.max_steps steps; returns every step's metrics (same on every rank except
  /// peak_bytes). Saves the final checkpoint (logical tensors, gathered over tp) on rank 0
  /// when checkpoint.save_final.
  std::vector<StepMetrics> run();

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
  const ParameterList& parameters() const { return stage_->parameters(); }
  PipelineStage& stage() { return *stage_; }
  /// Parameters of the whole logical model (every stage, no padding, tied weights once).
  std::int64_t logical_parameters() const { return logical_parameters_; }
  const pp::PipelineExecutor& executor() const { return *executor_; }
  /// Where parameters, master weights and gradients live (parallel.zero_stage).
  ZeroSharding& zero() { return *zero_; }
  /// fp16 only; nullptr otherwise.
  const DynamicLossScaler* loss_scaler() const { return scaler_.get(); }
  const DeviceMesh& mesh() const { return *mesh_; }
  const Config& config() const { return config_; }
  const data::Metadata& metadata() const { return metadata_; }
  /// Every logical parameter of the model (all stages, tp shards gathered without padding, the
  /// fp32 masters gathered over dp under ZeRO, gpt2's tied embedding once), meshtrain names,
  /// [out, in], f32, MemCategory::other, on every rank (each stage broadcasts its tensors over
  /// pp). Collective over tp, dp and pp: every rank calls it. The source of the final
  /// checkpoint and of `meshtrain export`'s tensors.
  std::vector<NamedTensor> logical_tensors();

 private:
  void log_step(const StepMetrics& m);
  /// Seconds this rank has spent inside collectives, over all its groups.
  double comm_seconds() const;
  /// The dp group's counters plus, under cp, the dp × cp group's (the gradient reduction).
  CommCounter dp_comm_total() const;
  /// End of a straggler window: all-gathers every rank's phase seconds, finds the stragglers.
  std::vector<Straggler> straggler_report(std::int64_t steps);
  void sum_tied_embeddings();
  void record_trace(std::int64_t step, double offset,
                    const std::vector<pp::ExecutedAction>& actions);
  void write_trace();
  /// Rank 0 prints every rank's peak bytes per memory category at the end of run().
  void report_peak_memory();
  /// checkpoint.resume: "auto" tries the complete checkpoints newest first (a bad one is
  /// reported and the previous one tried); a directory must load.
  void resume();
  std::filesystem::path checkpoint_root() const;

  Config config_;
  TrainerOptions options_;
  data::Metadata metadata_;
  data::TokenFile train_file_, val_file_;
  std::unique_ptr<data::GlobalBatchSampler> train_sampler_, val_sampler_;
  std::unique_ptr<DeviceMesh> mesh_;
  ProcessGroup& world_;
  // Started in the constructor, before the first collective on world_, and stopped last but
  // one (after the groups of mesh_ are gone, which it does not need).
  std::unique_ptr<WatchdogScope> watchdog_;
  std::unique_ptr<PipelineStage> stage_;
  std::unique_ptr<pp::PipelineExecutor> executor_;
  std::unique_ptr<StageRunner> runner_;
  std::unique_ptr<ProcessGroup> tied_group_;  // pp ranks 0 and pp − 1 (gpt2, pp > 1)
  double predicted_bubble_ = 0.0;
  std::int64_t logical_parameters_ = 0;
  double last_bubble_ = 0.0;
  std::vector<double> trace_;  // per action: step, kind, microbatch, chunk, start, end
  std::chrono::steady_clock::time_point t0_;
  std::unique_ptr<ReplicatedGradSum> replicated_grads_;
  std::unique_ptr<ZeroSharding> zero_;
  std::unique_ptr<DynamicLossScaler> scaler_;
  bool last_skipped_ = false;
  PhaseClock clock_;
  PhaseSeconds window_;  // optimizer and comm_wait; data/forward/backward live in runner_
  std::int64_t window_steps_ = 0;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<CheckpointWriter> checkpoint_writer_;  // checkpoint.interval > 0
  std::int64_t start_step_ = 0;
  bool reported_complete_ = true;   // the last save's completion was logged
  double last_checkpoint_s_ = 0.0;  // the training thread's time in the last save_checkpoint
  std::vector<std::int32_t> inputs_, targets_;
  std::ofstream metrics_;
  int threads_ = 1;
};

}  // namespace meshtrain
