// src/meshtrain/train/trainer_options.h — what a Trainer is given besides its config
// (TrainerOptions: output files, logging, the ranks sharing a node) and what it
// hands back per step (StepMetrics). Plain structs, shared by the trainer's parts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/train/moe_metrics.h"
#include "meshtrain/train/straggler.h"

namespace meshtrain {

struct StepMetrics {
  std::int64_t step = 0;  // optimizer steps done, 1-based
  double epoch = 0.0;     // passes over the train split: sequences / windows (docs/data.md)
  double loss = 0.0;      // mean train loss of the global batch
  double lr = 0.0;
  double grad_norm = 0.0;  // global, before clipping
  double step_time_s = 0.0;
  double tokens_per_s = 0.0;    // global batch tokens / step time
  double mfu = 0.0;             // model FLOP/s utilisation against training.peak_flops_per_core
  std::int64_t peak_bytes = 0;  // this rank's tracked-allocator peak, all categories
  std::int64_t allocator_misses = 0;  // this rank's allocations the cache missed in the step
  std::int64_t minor_faults = 0;      // this rank's minor page faults in the step (ru_minflt)
  // Bytes this rank handed to collectives during the step (training only, not evaluation),
  // per group, counted as ProcessGroup's counters define them (all-gather: the input).
  std::int64_t tp_comm_bytes = 0;
  std::int64_t dp_comm_bytes = 0;  // under cp: the dp × cp group's (gradient reduction)
  // Context parallel: K/V (ring) or all-to-all (Ulysses) bytes of the cp group.
  std::int64_t cp_comm_bytes = 0;
  // Seconds this rank spent inside those collectives (waiting for peers included).
  double tp_comm_s = 0.0;
  double dp_comm_s = 0.0;
  // Seconds the step spent on the dp gradient reduction outside compute: after its last
  // backward and in the hooks during it (what parallel.overlap_grad_reduce did not hide;
  // OptimizerState::dp_exposed_seconds).
  double dp_comm_exposed_s = 0.0;
  double cp_comm_s = 0.0;
  // Seconds in the attention core's kernels during the step (forward, backward, recompute;
  // not evaluation): cp_comm_s / attention_s is the share of attention time spent waiting
  // for K/V (p2p) or all-to-alls (a2a) that the compute did not hide.
  double attention_s = 0.0;
  // Expert parallel: the ep group's all-to-all bytes and seconds (token dispatch and combine
  // with their count exchanges, forward and backward).
  std::int64_t ep_comm_bytes = 0;
  double ep_comm_s = 0.0;
  // MoE models: per MoE layer, the step's routing over the global batch (train/moe_metrics.h).
  std::vector<MoeLayerMetrics> moe;
  // Pipeline (pp > 1): idle fraction of this step's schedule, measured per stage as
  // 1 − (time in compute actions) / (the longest stage's action-list time), averaged over the
  // pp ranks.
  double bubble = 0.0;
  // fp16: the loss scale this step's backward used, and whether the step was skipped because a
  // gradient overflowed on some rank (every rank skips it). 1 and false otherwise.
  double loss_scale = 1.0;
  bool skipped = false;
  // Seconds the training thread spent saving a sharded checkpoint after this step (0 when
  // none was saved): waiting for the previous save, copying the state, and under
  // checkpoint.async = false writing it.
  double checkpoint_s = 0.0;
  // Straggler report, on the steps that end a training.straggler_interval window (same on
  // every rank): the ranks named, with their slow phase.
  bool straggler_report = false;
  std::vector<Straggler> stragglers;
  std::optional<double> val_loss;
};

struct TrainerOptions {
  std::string metrics_path;     // JSON lines on rank 0; empty = none
  std::string trace_path;       // --trace: the whole-step Chrome trace (rank 0); empty = none
  std::string tensorboard_dir;  // TensorBoard event file of every metric (rank 0); empty = none
  int trace_steps = 10;         // steps recorded in the trace (the first ones)
  bool log = true;              // one line per log_interval steps on rank 0
  int local_ranks = 1;          // ranks of this job on this node (they share its cores)
};

}  // namespace meshtrain
