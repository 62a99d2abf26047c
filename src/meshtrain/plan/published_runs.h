// src/meshtrain/plan/published_runs.h
//
// Validation of the planner against published runs (issue 7, item 4(b)): the ten weak-scaling
// runs of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
// Using Megatron-LM", SC21, arXiv 2104.04473, Table 1), each accounted by account() on the
// matching 8×A100-80GB preset, and compared with the published teraFLOP/s per GPU after one
// efficiency calibration. docs/planner.md, "Validation / Published runs", holds the table.
// Uses: plan/accounting, plan/cluster, plan/layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/plan/accounting.h"

namespace meshtrain::plan {

/// One row of Narayanan et al. 2021, Table 1, as published. Every run: GPT (gpt2 family:
/// LayerNorm, GELU, learned positions, tied head), sequence 2048, vocabulary 51,200, mixed
/// precision (fp16), on Selene (DGX A100 80GB nodes: 8 GPUs on NVSwitch, 8 × 200 Gb/s HDR
/// InfiniBand per node), end-to-end (data loading, optimizer and logging included).
struct PublishedRun {
  const char* name;           // "1T"
  double billions;            // "Number of parameters (billion)"
  std::int64_t heads;         // attention heads
  std::int64_t hidden;        // hidden size h
  std::int64_t layers;        // transformer layers l
  std::int64_t tp;            // tensor model-parallel size t
  std::int64_t pp;            // pipeline model-parallel size p
  std::int64_t gpus;          // n = t·p·d
  std::int64_t global_batch;  // B, sequences
  double tflops_per_gpu;      // achieved teraFLOP/s per GPU (Eq. 3 FLOPs, with recompute)
  double percent_of_peak;     // of 312 teraFLOP/s (A100 16-bit tensor peak)
  double aggregate_pflops;    // achieved aggregate petaFLOP/s
};

/// The ten rows of Table 1 (1.7B … 1008B), in the paper's order.
const std::vector<PublishedRun>& narayanan2021_table1();

/// The settings the paper gives for all rows and the ones it leaves open, with the value the
/// validation assumes (docs/planner.md, "Published runs"): sequence 2048, vocabulary 51,200,
/// fp16, full activation recompute (Eq. 3's 96 = 4 passes), micro-batch 1, and for p > 1 the
/// interleaved schedule with v = 2.
struct PublishedAssumptions {
  std::int64_t seq = 2048;
  std::int64_t vocab = 51200;
  Precision precision = Precision::fp16;
  RecomputeMode recompute = RecomputeMode::full;
  std::int64_t micro_batch = 1;
  PipelineSchedule schedule = PipelineSchedule::interleaved_1f1b;  // for p > 1; 1f1b: v = 1
  std::int64_t v = 2;
};

/// How Megatron-LM 2021 communicates, as TimeSettings (docs/planner.md, "Published runs"):
/// 16-bit activations on the tp and pp wires (fp16 training), fp16 gradients reduced in one
/// all-reduce of the contiguous gradient buffer after the last micro-batch (no overlap), pipeline
/// sends split over the tp ranks' NICs (scatter/gather, §4.1). Efficiency left at 0 (the
/// cluster's default) until calibrated.
TimeSettings megatron_2021_time();

/// The run's model as a meshtrain ModelConfig (gpt2 family, biases, FFN 4h).
ModelConfig published_model(const PublishedRun& run, const PublishedAssumptions& a = {});
/// The run's layout: tp, pp from the table, dp = n/(t·p), micro-batch and accumulation from the
/// assumptions, ZeRO 0 (Megatron-LM 2021 replicates the optimizer state over dp).
Layout published_layout(const PublishedRun& run, const PublishedAssumptions& a = {});
TrainingSettings published_settings(const PublishedRun& run, const PublishedAssumptions& a = {});
/// The 8×A100-80GB preset with n/8 nodes.
ClusterSpec published_cluster(const PublishedRun& run);

/// The paper's FLOPs per iteration (Narayanan et al. 2021, §5.1, Eq. 3), with full recompute:
/// 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)). Its teraFLOP/s figures are this over the iteration
/// time and the GPUs.
double narayanan_flops_per_iteration(std::int64_t batch, std::int64_t seq, std::int64_t layers,
                                     std::int64_t hidden, std::int64_t vocab);

/// One row accounted: the plan and the throughput it predicts, counted as the paper counts it
/// (Eq. 3 FLOPs / predicted step time / GPUs), and the published step time that implies.
struct PublishedCheck {
  PublishedRun run;
  Plan plan;
  double flops_per_iteration = 0.0;  // Eq. 3
  double published_step_s = 0.0;     // Eq. 3 / (n · published FLOP/s per GPU)
  double predicted_tflops = 0.0;     // Eq. 3 / (n · predicted step time) / 1e12
  double error = 0.0;                // predicted / published − 1
};

PublishedCheck check_published_run(const PublishedRun& run, const TimeSettings& time,
                                   const PublishedAssumptions& a = {});

/// The efficiency (TimeSettings::efficiency) at which account() reproduces `run`'s published
/// teraFLOP/s exactly, every other setting of `time` kept (bisection on (0, 1]; the predicted
/// throughput rises monotonically with the efficiency). Throws std::runtime_error when no
/// efficiency ≤ 1 reaches it (communication and bubble alone are slower than the published step).
double calibrate_efficiency(const PublishedRun& run, TimeSettings time,
                            const PublishedAssumptions& a = {});

/// The row the validation calibrates on (docs/planner.md, "Calibration").
inline constexpr const char* kCalibrationRun = "145.6B";

/// Every row at the efficiency calibrated on kCalibrationRun.
std::vector<PublishedCheck> check_published_runs(TimeSettings time = megatron_2021_time(),
                                                 const PublishedAssumptions& a = {});

/// The comparison as a Markdown table (model, layout, published TFLOP/s and % of peak,
/// predicted, error, bubble, exposed communication share).
std::string format_published_table(const std::vector<PublishedCheck>& checks);

// --- Seed 000's production-configuration table (shared/seeds/000_*.txt, §6.2) ---

/// One row of the table as the article prints it, and what the checks assume where it says
/// nothing (docs/planner.md, "Seed 000's production table"):
///   Llama-3-8B   | 4×A100-80G  | TP 2 | PP 1 | DP 2 | CP × | EP × | micro_batch 8, seq 2048 | 328
///   Llama-3-70B  | 32×A100-80G | TP 4 | PP 4 | DP 2 | CP × | EP × | micro_batch 4, interleaved | 182
///   Mixtral-8x7B | 64×A100-80G | TP 4 | PP 2 | DP 4 | CP × | EP ✓ | 8 experts, top-2, capacity 1.8 | 145
///   LongChat-32B | 16×A100-80G | TP 2 | PP 2 | DP 4 | CP ✓ | EP × | seq 32768, cp_size 4 | 89
/// (samples/s). The note under it: the 70B figure is at global batch 1024. Assumed: seq 2048
/// where none is printed (70B, Mixtral: the table's other short-context row; both models were
/// pre-trained at longer contexts, and a longer sequence only raises the implied MFU); the
/// Mixtral row's ep = 8, the article's §5.2 ("8 experts over 8 groups of A100s, one each"),
/// which ep | dp = 4 rules out; global batches 16 (8B: mb 8 × dp 2; LongChat: 524,288 tokens),
/// 1024 (Mixtral, as the 70B row). LongChat-32B is LLaMA "33B" (`llama-33b`).
struct SeedLayoutRow {
  const char* name;
  const char* model_preset;
  std::int64_t gpus, tp, pp, dp, cp, ep;
  std::int64_t seq;
  bool seq_printed;           // false: assumed (above)
  std::int64_t global_batch;  // printed only for the 70B row
  std::int64_t micro_batch;
  PipelineSchedule schedule;
  double capacity_factor;  // the MoE row's; 0 elsewhere
  double samples_per_s;    // as printed
};
/// The four rows, in the article's order.
const std::vector<SeedLayoutRow>& seed000_table();
/// Its LongChat-32B row (and the others by name: "Llama-3-8B", "Llama-3-70B", "Mixtral-8x7B").
const SeedLayoutRow& seed000_longchat();
const SeedLayoutRow& seed000_row(const std::string& name);

/// The row's layout as printed (LongChat: p2p ring attention, the article's CP, mb 1, full
/// recompute for a 32K context; the others selective recompute, their printed micro-batch,
/// interleaved with v = 2 where printed), its settings (bf16; a MoE row's capacity factor on the
/// model) and cluster (gpus/8 nodes of 8xA100-80GB).
Layout seed_layout(const SeedLayoutRow& row);
TrainingSettings seed_settings(const SeedLayoutRow& row);
ClusterSpec seed_cluster(const SeedLayoutRow& row);
/// The row's model preset, with the row's capacity factor for a MoE model.
ModelConfig seed_model(const SeedLayoutRow& row);

}  // namespace meshtrain::plan
