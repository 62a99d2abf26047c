// src/meshtrain/config/config.h
//
// Plain config structs for a training run, one struct per TOML section. Every field has a
// default here; a TOML file and `--section.key value` command-line overrides (torchtitan's
// convention) set them through the key table of config_keys.h. Validation rules live in
// validate.h as pure functions, so the trainer, the CLI and (later) the planner share them
// and a bad config is rejected before any MPI call or allocation (DESIGN invariant 9).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "meshtrain/config/enum_names.h"
#include "meshtrain/config/layer_modes.h"

namespace meshtrain {

// model.family
enum class ModelFamily : std::uint8_t { gpt2, llama };
inline constexpr std::array<EnumName<ModelFamily>, 2> kModelFamilyNames{{
    {ModelFamily::gpt2, "gpt2", "LayerNorm, GELU, learned positions"},
    {ModelFamily::llama, "llama", "RMSNorm, SwiGLU, rotary positions, GQA"},
}};
constexpr const auto& enum_names(ModelFamily) { return kModelFamilyNames; }

// training.lr_scaling
enum class LrScaling : std::uint8_t { none, linear, sqrt };
inline constexpr std::array<EnumName<LrScaling>, 3> kLrScalingNames{{
    {LrScaling::none, "none", "lr as given"},
    {LrScaling::linear, "linear", "lr · B/B₀"},
    {LrScaling::sqrt, "sqrt", "lr · √(B/B₀)"},
}};
constexpr const auto& enum_names(LrScaling) { return kLrScalingNames; }

// training.precision
enum class Precision : std::uint8_t { fp32, bf16, fp16 };
inline constexpr std::array<EnumName<Precision>, 3> kPrecisionNames{{
    {Precision::fp32, "fp32", "full precision"},
    {Precision::bf16, "bf16", "mixed precision"},
    {Precision::fp16, "fp16", "mixed precision with a loss scaler"},
}};
constexpr const auto& enum_names(Precision) { return kPrecisionNames; }

// parallel.pp_schedule (docs/pipeline_parallel.md)
enum class PipelineSchedule : std::uint8_t { gpipe, one_f_one_b, interleaved_1f1b, zb_h1 };
inline constexpr std::array<EnumName<PipelineSchedule>, 4> kPipelineScheduleNames{{
    {PipelineSchedule::gpipe, "gpipe", "all forwards, then all backwards"},
    {PipelineSchedule::one_f_one_b, "1f1b", "one forward, one backward"},
    {PipelineSchedule::interleaved_1f1b, "interleaved_1f1b", "1f1b over virtual stages"},
    {PipelineSchedule::zb_h1, "zb_h1", "zero bubble, weight gradients deferred"},
}};
constexpr const auto& enum_names(PipelineSchedule) { return kPipelineScheduleNames; }

// data.format (docs/data.md, "Token files"; the data layer's TokenLayout, train/ maps it)
enum class DataFormat : std::uint8_t { meshtrain, nanogpt, llmc };
inline constexpr std::array<EnumName<DataFormat>, 3> kDataFormatNames{{
    {DataFormat::meshtrain, "meshtrain", "meshtrain prepare's files and meta.json"},
    {DataFormat::nanogpt, "nanogpt", "raw uint16 ids, no header"},
    {DataFormat::llmc, "llmc", "llm.c's 1024-byte header, uint16 or uint32 ids"},
}};
constexpr const auto& enum_names(DataFormat) { return kDataFormatNames; }

// data.sampler (docs/data.md, "Samplers"; the data layer's SampleOrder, train/ maps it)
enum class DataSampler : std::uint8_t { random, epoch };
inline constexpr std::array<EnumName<DataSampler>, 2> kDataSamplerNames{{
    {DataSampler::random, "random", "nanoGPT's random windows"},
    {DataSampler::epoch, "epoch", "every window once per epoch, shuffled"},
}};
constexpr const auto& enum_names(DataSampler) { return kDataSamplerNames; }

// fault_injection.nonfinite_grad_value: what the injected gradient element becomes
enum class FaultValue : std::uint8_t { inf, nan };
inline constexpr std::array<EnumName<FaultValue>, 2> kFaultValueNames{{
    {FaultValue::inf, "inf", "+infinity, an overflow"},
    {FaultValue::nan, "nan", "a quiet NaN"},
}};
constexpr const auto& enum_names(FaultValue) { return kFaultValueNames; }

// fault_injection.slow_phase: the compute phase a slow rank sleeps in (train/straggler.h)
enum class FaultPhase : std::uint8_t { forward, backward };
inline constexpr std::array<EnumName<FaultPhase>, 2> kFaultPhaseNames{{
    {FaultPhase::forward, "forward", "every forward call"},
    {FaultPhase::backward, "backward", "every backward call"},
}};
constexpr const auto& enum_names(FaultPhase) { return kFaultPhaseNames; }

MESHTRAIN_CONFIG_ENUM_JSON(ModelFamily)
MESHTRAIN_CONFIG_ENUM_JSON(LrScaling)
MESHTRAIN_CONFIG_ENUM_JSON(Precision)
MESHTRAIN_CONFIG_ENUM_JSON(PipelineSchedule)
MESHTRAIN_CONFIG_ENUM_JSON(DataFormat)
MESHTRAIN_CONFIG_ENUM_JSON(DataSampler)
MESHTRAIN_CONFIG_ENUM_JSON(FaultValue)
MESHTRAIN_CONFIG_ENUM_JSON(FaultPhase)

struct ModelConfig {
  // "gpt2": LayerNorm, GELU MLP, learned positions, tied LM head (Radford et al. 2019).
  // "llama": RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, untied LM head
  // (Touvron et al. 2023).
  ModelFamily family = ModelFamily::gpt2;
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_kv_head = 0;    // key/value heads (llama GQA); 0 = n_head
  std::int64_t n_embd = 128;     // hidden size C
  std::int64_t ffn_hidden = 0;   // MLP hidden size F; 0 = the family's rule (ffn_hidden_of)
  std::int64_t block_size = 64;  // sequence length T (tokens per sequence)
  std::int64_t vocab_size = 0;   // 0: from meta.json or data.tokenizer (docs/data.md)
  bool bias = true;              // biases in linears and LayerNorm (gpt2 only; llama has none)
  double dropout = 0.0;          // must be 0 in this version
  double init_std = 0.02;        // N(0, init_std²) weights (Radford et al. 2019, §2.3)
  double norm_eps = 1e-5;        // LayerNorm / RMSNorm epsilon
  double rope_theta = 10000.0;   // llama: rotary embedding base (Su et al. 2021, §3.2.2)
  // Mixture of experts (docs/moe.md; Megatron-LM's --num-experts, --moe-router-topk,
  // --moe-ffn-hidden-size, --moe-layer-freq, --moe-expert-capacity-factor,
  // --moe-token-drop-policy, --moe-aux-loss-coeff, --moe-z-loss-coeff). llama family only:
  // the MLP of every moe_layer_freq-th block (layers i with i % freq == 0) becomes a
  // Mixtral sparse MoE block of moe_experts SwiGLU experts, each token routed to moe_top_k.
  std::int64_t moe_experts = 0;      // E; 0 = dense model
  std::int64_t moe_top_k = 2;        // k, 1 ≤ k ≤ E (Mixtral: 2)
  std::int64_t moe_ffn_hidden = 0;   // each expert's F; 0 = ffn_hidden_of(model)
  std::int64_t moe_layer_freq = 1;   // 1: every block is MoE; n: blocks 0, n, 2n, …
  double moe_capacity_factor = 0.0;  // 0 = dropless; else ⌈N·k/E·factor⌉ per expert
  MoeDropPolicy moe_token_drop_policy = MoeDropPolicy::probs;
  double moe_aux_loss_coeff = 0.0;  // Switch load-balancing loss (Megatron's usual: 1e-2)
  double moe_z_loss_coeff = 0.0;    // ST-MoE router z-loss (usual: 1e-3)
};

struct TrainingConfig {
  std::int64_t micro_batch = 12;  // sequences per rank per forward/backward
  std::int64_t accumulation = 1;  // micro-batches per rank per optimizer step
  std::int64_t global_batch = 0;  // sequences per step; 0 = micro_batch × accumulation × dp
  std::int64_t max_steps = 2000;
  double lr = 1e-3;  // peak learning rate (before any batch-size scaling)
  double min_lr = 1e-4;
  std::int64_t warmup_steps = 100;
  std::int64_t lr_decay_steps = 0;         // cosine from warmup to here; 0 = max_steps
  LrScaling lr_scaling = LrScaling::none;  // none | linear | sqrt (seed 002, batch-size rules)
  std::int64_t lr_base_batch = 0;          // the global batch at which `lr` was tuned (for scaling)
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global grad-norm clipping; 0 = off
  // Check each rank's gradients for a non-finite value before every reduction that would spread
  // it, so a non-finite grad norm names where it first appeared (Megatron-LM's
  // --check-for-nan-in-loss-and-grad); false skips that read pass (docs/resilience.md). A
  // bucket in a shared-memory window is checked inside its all-reduce whatever this says.
  bool check_for_nan_in_grad = true;
  std::int64_t eval_interval = 250;  // steps between val evaluations; 0 = only at the end
  std::int64_t eval_batches = 20;    // global batches averaged for val loss
  std::int64_t log_interval = 1;     // steps between log lines on rank 0
  std::int64_t seed = 1337;
  std::int64_t threads = 0;  // compute threads per rank; 0 = cores / local ranks
  // Activation recompute (Korthikanti et al. 2022, §4.2, §5): "none"; "selective" (each
  // attention drops its core's output and log-sum-exp and recomputes them from q, k, v in
  // backward); "full" (each block keeps only its input and runs its forward again in backward).
  RecomputeMode recompute = RecomputeMode::none;
  double peak_flops_per_core = 2.19e11;  // fp32 FMA peak used for MFU (DESIGN machine notes)
  // Mixed precision (Micikevicius et al. 2018; docs/memory.md): "fp32", or "bf16" / "fp16":
  // parameters and matrix products in 16 bits with fp32 accumulation, fp32 master weights
  // and fp32 gradients.
  Precision precision = Precision::fp32;
  // Dynamic loss scaler, fp16 only (Micikevicius et al. 2018, §3.2; Megatron-LM's
  // DynamicGradScaler): the loss is multiplied by the scale before backward; a step whose
  // gradients hold an inf or NaN on any rank is skipped by every rank, and after `hysteresis`
  // such steps the scale is multiplied by `backoff`; after `growth_interval` clean steps in a
  // row it is multiplied by `growth`.
  double loss_scale_init = 65536.0;
  std::int64_t loss_scale_growth_interval = 1000;
  double loss_scale_growth = 2.0;
  double loss_scale_backoff = 0.5;
  std::int64_t loss_scale_hysteresis = 2;
  // Straggler report (train/straggler.h): every `straggler_interval` steps (0 = never) the
  // ranks compare their time per phase; a rank whose compute phase exceeds the median rank's
  // by more than `straggler_threshold` × the median step time is named in the log and metrics.
  std::int64_t straggler_interval = 100;
  double straggler_threshold = 0.2;
};

struct ParallelConfig {
  std::int64_t dp = 1;
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::int64_t cp = 1;
  // Expert parallel (docs/moe.md): carved out of dp (ep | dp); ep rank e of a dp × cp group
  // holds experts [e·E/ep, (e+1)·E/ep) and tokens reach them by all-to-all.
  std::int64_t ep = 1;
  // Context parallel (docs/context_parallel.md): each sequence is cut into 2·cp chunks, cp rank
  // c holding chunks c and 2·cp−1−c (zigzag). "p2p": ring attention, K and V travel around the
  // cp ring (Liu et al. 2023); "a2a": Ulysses all-to-all between sequence and head sharding
  // (Jacobs et al. 2023). Megatron-LM's --cp-comm-type names.
  CpCommMode cp_comm = CpCommMode::p2p;
  // Megatron sequence parallelism (Korthikanti et al. 2022, §4.2.2): norms and residuals hold
  // [tokens/tp, C]; needs tp > 1 to change anything and block_size % tp == 0.
  bool sequence_parallel = false;
  // Pipeline parallel (docs/pipeline_parallel.md): the schedule, model chunks per rank, and an
  // optional explicit split ("2,2,1,1": layers of each of the pp × virtual_stages chunks). The
  // micro-batches per step are training.accumulation.
  PipelineSchedule pp_schedule = PipelineSchedule::one_f_one_b;  // see kPipelineScheduleNames
  std::int64_t virtual_stages = 1;
  std::string pp_layers;        // empty = even split
  std::int64_t bucket_mib = 4;  // gradient all-reduce bucket size, MiB
  // ZeRO-0 with dp > 1 (docs/data_parallel.md, "Overlap"): each bucket's all-reduce is posted
  // during backward, as soon as the last micro-batch's backward has finished its gradients,
  // and overlaps the rest of backward (Megatron-LM's --overlap-grad-reduce). Off: all buckets
  // are reduced after backward. Same gradients bit for bit either way. Ignored (off, with a
  // note in the log) under pp_schedule = zb_h1, whose weight gradients wait for W passes.
  bool overlap_grad_reduce = true;
  // ZeRO stage over dp (Rajbhandari et al. 2020; parallel/dp/zero.h): 0 = plain data parallel,
  // 1 = optimizer state sharded, 2 = + gradients, 3 = + parameters (FSDP FULL_SHARD).
  std::int64_t zero_stage = 0;
  // Debug: before every collective the ranks of its group compare what they call (operation,
  // element type and count, root, sequence number) and fail with every rank's call printed
  // when they differ (comm/process_group.h, set_debug_checks). One small all-reduce per
  // collective.
  bool debug_collectives = false;
  // Watchdog (monitor/watchdog.h): a collective, send/recv or wait that has not completed after
  // `comm_timeout_s` seconds ends the job with a report naming the operation, group, sequence
  // number and the peers that have not reached it; the last `flight_recorder_size` operations
  // of the rank are dumped to a file.
  double comm_timeout_s = 600.0;
  std::int64_t flight_recorder_size = 256;
};

// docs/data.md. The token files are data.dir/train_file and data.dir/val_file (plain names,
// never a path out of the directory). "meshtrain": meshtrain prepare's files, their id width
// and vocabulary in data.dir/meta.json. "nanogpt": nanoGPT's raw uint16 train.bin / val.bin.
// "llmc": llm.c's files (e.g. tiny_shakespeare_train.bin), uint16 or uint32 as the header
// says. nanoGPT's and llm.c's files do not record a vocabulary: data.tokenizer or
// model.vocab_size gives it.
struct DataConfig {
  std::string dir = "data/prepared/shakespeare_char";
  DataFormat format = DataFormat::meshtrain;
  std::string train_file = "train.bin";
  std::string val_file = "val.bin";
  // "random": each sequence a uniformly random window (nanoGPT). "epoch": every window of
  // seq_len + 1 tokens at stride seq_len once per epoch, in a seeded order per epoch
  // (Megatron-LM's sample and shuffle indices); validation reads its windows in that order too.
  DataSampler sampler = DataSampler::random;
  // The tokenizer of the token files: "" = none (meshtrain's format: meta.json's), "gpt2" (the
  // shipped data/tokenizers/gpt2), a directory with GPT-2's encoder.json + vocab.bpe, or a
  // SentencePiece .model (data/tokenizer.h, open_tokenizer). With "nanogpt" / "llmc" it gives
  // the vocabulary and is saved with the final checkpoint; with "meshtrain" it must be
  // meta.json's.
  std::string tokenizer;
};

struct CheckpointConfig {
  std::string dir = "runs/shakespeare_char";  // the final checkpoint is written here
  bool save_final = true;
  // Sharded, resumable checkpoints (checkpoint/sharded_checkpoint.h): every `interval` steps
  // (0 = never) each rank writes its shards under dir/checkpoints/step-NNNNNNNN/; the newest
  // `keep_last` complete ones are kept. `async`: the state is copied to host buffers and a
  // background thread writes it while training goes on.
  std::int64_t interval = 0;
  std::int64_t keep_last = 2;
  bool async = true;
  // "" = start at step 0; "auto" = the newest complete checkpoint under dir/checkpoints (none:
  // start at step 0); otherwise a checkpoint directory, loaded under whatever layout this run
  // has (resharding).
  std::string resume;
  // A consolidated model.safetensors with Hugging Face names (meshtrain export, or a Hugging
  // Face GPT-2 / Llama file of the same shape) to start training from; "" = initialise.
  std::string init_from;
};

// Fault injection (docs/resilience.md, "Fault injection"; train/fault_injector.h): rehearsals
// of the failures a job must survive or report, on any cluster, all off by default. Ranks are
// world ranks, steps the 1-based optimizer steps of the log (global: a resumed run counts on).
// Every fault is injected only on a job's first attempt: not when MESHTRAIN_RESTART_COUNT
// (set by `meshtrain launch` on each restart) or SLURM_RESTART_COUNT is above 0, so a
// restarted job recovers instead of failing again. A checkpoint stores these settings at their
// defaults: a rehearsal belongs to its run, not to the training state.
struct FaultInjectionConfig {
  // A non-finite gradient: at the start of the checks of step `nonfinite_grad_step` (−1 =
  // never), after the gradient reductions, rank `nonfinite_grad_rank` writes
  // `nonfinite_grad_value` into its first gradient element (fp16: the step is skipped; else
  // the run stops with the rank, step and parameter named).
  std::int64_t nonfinite_grad_step = -1;
  std::int64_t nonfinite_grad_rank = 0;
  FaultValue nonfinite_grad_value = FaultValue::inf;
  // A slow rank (straggler): rank `slow_rank` (−1 = none) sleeps `slow_seconds` at the start
  // of every call of `slow_phase`; the straggler report names it.
  std::int64_t slow_rank = -1;
  FaultPhase slow_phase = FaultPhase::backward;
  double slow_seconds = 0.0;
  // A lost process: rank `kill_rank` raises SIGKILL on itself at the start of step
  // `kill_step` (−1 = never).
  std::int64_t kill_step = -1;
  std::int64_t kill_rank = 0;
  // A hung process: rank `hang_rank` stops (sleeps, never exits) at the start of step
  // `hang_step` (−1 = never); its peers' watchdogs name it after parallel.comm_timeout_s and
  // end the job with exit code 4.
  std::int64_t hang_step = -1;
  std::int64_t hang_rank = 0;
};

struct Config {
  ModelConfig model;
  TrainingConfig training;
  ParallelConfig parallel;
  DataConfig data;
  CheckpointConfig checkpoint;
  FaultInjectionConfig fault_injection;
  std::string source = "<defaults>";  // where it came from, for error messages
};

}  // namespace meshtrain
