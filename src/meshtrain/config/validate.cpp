#include "meshtrain/config/validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <string>
#include <tuple>

#include "meshtrain/config/pipeline_rules.h"

namespace meshtrain {
namespace {

constexpr std::int64_t kMaxBucketMib = std::int64_t{1} << 20;  // 1 TiB

// The divisors of n up to 1024, for suggestions in messages: O(1024) whatever n is (a huge
// setting must get its error at once, not after a loop over n).
std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d <= std::min<std::int64_t>(n, 1024); ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

template <typename T>
void require(std::vector<ConfigIssue>& issues, bool ok, const std::string& setting, const T& value,
             std::string rule, std::string fix) {
  if (!ok) issues.push_back({setting, fmt::format("{}", value), std::move(rule), std::move(fix)});
}

void check_model(const ModelConfig& m, std::vector<ConfigIssue>& issues) {
  // model.family and the other named settings are checked when loaded (config/load.cpp).
  const bool gpt2 = m.family == ModelFamily::gpt2, llama = m.family == ModelFamily::llama;
  require(issues, m.n_layer >= 1, "model.n_layer", m.n_layer, "must be ≥ 1", "use e.g. 4");
  require(issues, m.n_head >= 1, "model.n_head", m.n_head, "must be ≥ 1", "use e.g. 4");
  require(issues, m.n_embd >= 1, "model.n_embd", m.n_embd, "must be ≥ 1", "use e.g. 128");
  require(issues, m.block_size >= 1, "model.block_size", m.block_size, "must be ≥ 1",
          "use e.g. 64");
  require(issues, m.vocab_size >= 0, "model.vocab_size", m.vocab_size,
          "must be ≥ 0 (0 = take it from the data's meta.json or data.tokenizer)",
          "leave it at 0, or give the tokenizer's vocabulary size");
  require(issues, m.ffn_hidden >= 0, "model.ffn_hidden", m.ffn_hidden,
          "must be ≥ 0 (0 = the family's rule: 4·n_embd for gpt2, Llama's ≈8/3·n_embd)",
          "leave it at 0");
  require(issues, m.n_kv_head >= 0, "model.n_kv_head", m.n_kv_head, "must be ≥ 0 (0 = n_head)",
          "leave it at 0");
  if (m.n_head >= 1 && m.n_embd >= 1) {
    require(issues, m.n_embd % m.n_head == 0, "model.n_embd", m.n_embd,
            fmt::format("must be divisible by model.n_head = {}: every head has n_embd/n_head "
                        "features",
                        m.n_head),
            fmt::format("choose model.n_head from {{{}}}, or n_embd a multiple of {}",
                        fmt::join(divisors(m.n_embd), ", "), m.n_head));
    if (m.n_kv_head >= 1) {
      require(
          issues, m.n_head % m.n_kv_head == 0, "model.n_kv_head", m.n_kv_head,
          fmt::format("must divide model.n_head = {}: each kv head serves n_head/n_kv_head "
                      "query heads (grouped-query attention)",
                      m.n_head),
          fmt::format("choose model.n_kv_head from {{{}}}", fmt::join(divisors(m.n_head), ", ")));
    }
    if (llama && m.n_embd % m.n_head == 0) {
      require(issues, (m.n_embd / m.n_head) % 2 == 0, "model.n_embd", m.n_embd,
              fmt::format("llama needs an even head size n_embd/n_head (= {}): rotary embedding "
                          "rotates pairs of features",
                          m.n_embd / m.n_head),
              "choose n_embd and n_head so that n_embd/n_head is even");
    }
  }
  require(issues, !gpt2 || m.n_kv_head == 0 || m.n_kv_head == m.n_head, "model.n_kv_head",
          m.n_kv_head, "gpt2 has no grouped-query attention: n_kv_head must be 0 or n_head",
          "set model.n_kv_head = 0, or model.family = \"llama\"");
  require(issues, !llama || !m.bias, "model.bias", m.bias,
          "llama has no biases in its linears or norms", "set model.bias = false");
  require(issues, m.dropout == 0.0, "model.dropout", m.dropout,
          "dropout is not yet supported (this version trains without it)",
          "set model.dropout = 0.0");
  require(issues, m.init_std > 0.0, "model.init_std", m.init_std, "must be > 0", "use 0.02");
  require(issues, m.norm_eps > 0.0, "model.norm_eps", m.norm_eps, "must be > 0", "use 1e-5");
  require(issues, m.rope_theta > 0.0, "model.rope_theta", m.rope_theta, "must be > 0",
          "use 10000 (Llama 2) or 500000 (Llama 3)");
}

// Context parallel (docs/context_parallel.md): the zigzag split cuts every sequence into
// 2·cp equal chunks; Ulysses gives every cp rank whole heads.
void check_context_parallel(const Config& c, std::vector<ConfigIssue>& issues) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  require(issues, p.cp >= 1, "parallel.cp", p.cp, "must be ≥ 1", "use 1 for no context parallel");
  if (p.cp < 2) return;
  require(
      issues, m.block_size < 1 || m.block_size % (2 * p.cp) == 0, "model.block_size", m.block_size,
      fmt::format("with parallel.cp = {} every sequence is cut into 2·cp = {} equal chunks "
                  "(the zigzag split that balances causal attention), so the sequence "
                  "length must be divisible by {}",
                  p.cp, 2 * p.cp, 2 * p.cp),
      fmt::format("set model.block_size to a multiple of {}, or a smaller parallel.cp", 2 * p.cp));
  if (p.cp_comm != CpCommMode::a2a || p.tp < 1) return;
  const std::int64_t heads = m.n_head / p.tp, kv = kv_heads_of(m) / p.tp;
  for (const auto& [name, value, local] : {std::tuple{"model.n_head", m.n_head, heads},
                                           std::tuple{"model.n_kv_head", kv_heads_of(m), kv}}) {
    require(issues, local < 1 || local % p.cp == 0, name, value,
            fmt::format("parallel.cp_comm = \"a2a\" (Ulysses) gives each cp rank whole heads: "
                        "the {} per tp rank ({} / tp {} = {}) must be divisible by "
                        "parallel.cp = {}",
                        name, value, p.tp, local, p.cp),
            "use parallel.cp_comm = \"p2p\" (ring attention has no head rule), or a cp that "
            "divides the heads per tp rank");
  }
}

// Mixture of experts and expert parallel (docs/moe.md).
void check_moe(const Config& c, std::vector<ConfigIssue>& issues) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  require(issues, m.moe_experts >= 0, "model.moe_experts", m.moe_experts,
          "must be ≥ 0 (0 = a dense model)", "use 0, or e.g. 8 experts");
  require(issues, p.ep >= 1, "parallel.ep", p.ep, "must be ≥ 1", "use 1 for no expert parallel");
  if (m.moe_experts < 1) {
    require(issues, p.ep <= 1, "parallel.ep", p.ep,
            "expert parallel spreads the experts of MoE layers, and model.moe_experts = 0 "
            "(a dense model) has none",
            "set parallel.ep = 1, or (llama family) model.moe_experts to a multiple of it");
    return;
  }
  const std::int64_t E = m.moe_experts;
  require(issues, m.family == ModelFamily::llama, "model.family", to_string(m.family),
          "MoE layers (model.moe_experts > 0) are Mixtral's: SwiGLU experts in the llama family",
          "set model.family = \"llama\", or model.moe_experts = 0");
  require(issues, m.moe_top_k >= 1 && m.moe_top_k <= E, "model.moe_top_k", m.moe_top_k,
          fmt::format("each token picks moe_top_k distinct experts of the {}: 1 ≤ k ≤ {}", E, E),
          fmt::format("use 2 (Mixtral), or at most {}", E));
  require(issues, m.moe_ffn_hidden >= 0, "model.moe_ffn_hidden", m.moe_ffn_hidden,
          "must be ≥ 0 (0 = model.ffn_hidden's rule)", "leave it at 0");
  require(issues, m.moe_layer_freq >= 1, "model.moe_layer_freq", m.moe_layer_freq,
          "must be ≥ 1 (1 = every block is MoE, n = blocks 0, n, 2n, …)", "use 1");
  require(issues, std::isfinite(m.moe_capacity_factor) && m.moe_capacity_factor >= 0.0,
          "model.moe_capacity_factor", m.moe_capacity_factor,
          "must be ≥ 0 (0 = dropless; else each expert keeps ⌈N·k/E·factor⌉ assignments)",
          "use 0 (dropless) or e.g. 1.25");
  for (const auto& [name, value] : {std::pair{"model.moe_aux_loss_coeff", m.moe_aux_loss_coeff},
                                    std::pair{"model.moe_z_loss_coeff", m.moe_z_loss_coeff}}) {
    require(issues, std::isfinite(value) && value >= 0.0, name, value, "must be ≥ 0",
            "use 0 (off), or 1e-2 (aux) / 1e-3 (z) as Megatron-LM's examples");
  }
  if (p.ep < 2) return;
  require(issues, E % p.ep == 0, "parallel.ep", p.ep,
          fmt::format("each ep rank holds moe_experts / ep experts: model.moe_experts = {} must "
                      "be divisible by parallel.ep",
                      E),
          "use an ep that divides the number of experts");
  require(issues, p.dp < 1 || p.dp % p.ep == 0, "parallel.ep", p.ep,
          fmt::format("expert parallel is carved out of data parallel: parallel.dp = {} must be "
                      "divisible by parallel.ep",
                      p.dp),
          "use an ep that divides parallel.dp (the world is pp·dp·cp·tp; ep adds no ranks)");
}

void check_parallel(const Config& c, int world_size, std::vector<ConfigIssue>& issues) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  check_moe(c, issues);
  check_pipeline(c, issues);
  check_context_parallel(c, issues);
  require(issues, p.dp >= 1, "parallel.dp", p.dp, "must be ≥ 1", "use 1 for a single process");
  require(issues, p.tp >= 1, "parallel.tp", p.tp, "must be ≥ 1", "use 1 for no tensor parallel");
  // The upper bound keeps bucket_mib << 20 (bytes, int64) far from overflow; 1 TiB is more
  // than any model's gradients, i.e. one bucket.
  require(issues, p.bucket_mib >= 1 && p.bucket_mib <= kMaxBucketMib, "parallel.bucket_mib",
          p.bucket_mib, "must be from 1 to 1048576 MiB (1 TiB)",
          "use 4 (the measured best on the project's machines)");
  if (p.tp >= 2) {
    // Megatron-LM's rules (Shoeybi et al. 2019, §3): heads and MLP features split evenly.
    const std::int64_t kv = kv_heads_of(m);
    require(issues, m.n_head < 1 || m.n_head % p.tp == 0, "model.n_head", m.n_head,
            fmt::format("must be divisible by parallel.tp = {}: attention heads are split over "
                        "the tensor-parallel ranks",
                        p.tp),
            fmt::format("choose parallel.tp from {{{}}}",
                        fmt::join(divisors(std::max<std::int64_t>(m.n_head, 1)), ", ")));
    if (m.n_kv_head != 0 && m.n_kv_head != m.n_head) {
      require(issues, kv < 1 || kv % p.tp == 0, "model.n_kv_head", m.n_kv_head,
              fmt::format("must be divisible by parallel.tp = {}: key/value heads are split over "
                          "the tensor-parallel ranks",
                          p.tp),
              fmt::format("choose parallel.tp from {{{}}}, or a larger model.n_kv_head",
                          fmt::join(divisors(std::max<std::int64_t>(kv, 1)), ", ")));
    }
    const std::int64_t ffn = ffn_hidden_of(m);
    require(issues, ffn < 1 || ffn % p.tp == 0, "model.ffn_hidden",
            m.ffn_hidden > 0 ? fmt::format("{}", ffn)
                             : fmt::format("0 (the {} default for n_embd = {}: {})",
                                           to_string(m.family), m.n_embd, ffn),
            fmt::format("the MLP hidden size must be divisible by parallel.tp = {}", p.tp),
            fmt::format("set model.ffn_hidden to a multiple of {}", p.tp));
    // Under cp a rank holds block_size/cp tokens of every sequence (checked above to split).
    const std::int64_t cp = p.cp >= 1 ? p.cp : 1;
    if (p.sequence_parallel && (cp == 1 || m.block_size % (2 * cp) == 0)) {
      require(
          issues, m.block_size < 1 || (m.block_size / cp) % p.tp == 0, "model.block_size",
          m.block_size,
          fmt::format(
              "with parallel.sequence_parallel the tokens of a micro-batch are split "
              "over the tp ranks, so the sequence length{} must be divisible by "
              "parallel.tp = {} (Megatron-LM's rule: then every micro-batch size "
              "splits evenly)",
              cp > 1 ? fmt::format(" per cp rank (block_size / cp = {})", m.block_size / cp) : "",
              p.tp),
          fmt::format("set model.block_size to a multiple of {}, or "
                      "parallel.sequence_parallel = false",
                      cp > 1 ? 2 * cp * p.tp : p.tp));
    }
  }
  const std::int64_t ranks = p.pp * p.dp * p.cp * p.tp;
  if (ranks >= 1 && ranks != world_size) {
    issues.push_back({"parallel.pp × dp × cp × tp",
                      fmt::format("{} × {} × {} × {} = {}", p.pp, p.dp, p.cp, p.tp, ranks),
                      fmt::format("must equal the number of ranks launched ({})", world_size),
                      world_size % (p.pp * p.cp * p.tp) == 0 && p.pp * p.cp * p.tp >= 1
                          ? fmt::format("launch with `mpirun -np {}`, or pass --parallel.dp {}",
                                        ranks, world_size / (p.pp * p.cp * p.tp))
                          : fmt::format("launch with `mpirun -np {}`", ranks)});
  }
}

void check_batch(const TrainingConfig& t, const ParallelConfig& p,
                 std::vector<ConfigIssue>& issues) {
  require(issues, t.micro_batch >= 1, "training.micro_batch", t.micro_batch, "must be ≥ 1",
          "use e.g. 12");
  require(issues, t.accumulation >= 1, "training.accumulation", t.accumulation, "must be ≥ 1",
          "use 1 for no gradient accumulation");
  require(issues, t.global_batch >= 0, "training.global_batch", t.global_batch,
          "must be ≥ 0 (0 = micro_batch × accumulation × dp)", "leave it at 0");
  if (t.micro_batch < 1 || t.accumulation < 1 || p.dp < 1 || t.global_batch <= 0) return;
  const std::int64_t product = t.micro_batch * t.accumulation * p.dp;
  if (t.global_batch == product) return;
  std::string fix;
  if (t.global_batch % (t.micro_batch * p.dp) == 0) {
    fix = fmt::format("set training.accumulation = {}", t.global_batch / (t.micro_batch * p.dp));
  } else if (t.global_batch % (t.accumulation * p.dp) == 0) {
    fix = fmt::format("set training.micro_batch = {}", t.global_batch / (t.accumulation * p.dp));
  } else {
    fix = fmt::format(
        "choose a global batch divisible by dp = {}, or set training.global_batch "
        "= {} (or 0 to derive it)",
        p.dp, product);
  }
  issues.push_back({"training.global_batch", fmt::format("{}", t.global_batch),
                    fmt::format("must equal micro_batch × accumulation × dp = {} × {} × {} = {}",
                                t.micro_batch, t.accumulation, p.dp, product),
                    fix});
}

void check_optimizer(const TrainingConfig& t, std::vector<ConfigIssue>& issues) {
  require(issues, t.max_steps >= 1, "training.max_steps", t.max_steps, "must be ≥ 1",
          "use e.g. 2000");
  require(issues, t.lr > 0.0, "training.lr", t.lr, "must be > 0", "use e.g. 1e-3");
  require(issues, t.min_lr >= 0.0 && t.min_lr <= t.lr, "training.min_lr", t.min_lr,
          fmt::format("must lie in [0, training.lr = {}]", t.lr), "use e.g. lr / 10");
  require(issues, t.warmup_steps >= 0, "training.warmup_steps", t.warmup_steps, "must be ≥ 0",
          "use e.g. 100");
  require(issues, t.lr_decay_steps >= 0, "training.lr_decay_steps", t.lr_decay_steps,
          "must be ≥ 0 (0 = max_steps)", "leave it at 0");
  require(issues, t.lr_scaling == LrScaling::none || t.lr_base_batch >= 1, "training.lr_base_batch",
          t.lr_base_batch, "a scaling rule needs the global batch at which lr was tuned (≥ 1)",
          "set training.lr_base_batch, e.g. to 12");
  require(issues, t.beta1 >= 0.0 && t.beta1 < 1.0, "training.beta1", t.beta1, "must lie in [0, 1)",
          "use 0.9");
  require(issues, t.beta2 >= 0.0 && t.beta2 < 1.0, "training.beta2", t.beta2, "must lie in [0, 1)",
          "use 0.99 or 0.999");
  require(issues, t.eps > 0.0, "training.eps", t.eps, "must be > 0", "use 1e-8");
  require(issues, t.weight_decay >= 0.0, "training.weight_decay", t.weight_decay, "must be ≥ 0",
          "use 0.1");
  require(issues, t.grad_clip >= 0.0, "training.grad_clip", t.grad_clip,
          "must be ≥ 0 (0 = no clipping)", "use 1.0");
  require(issues, t.eval_interval >= 0, "training.eval_interval", t.eval_interval,
          "must be ≥ 0 (0 = evaluate at the end only)", "use e.g. 250");
  require(issues, t.eval_batches >= 1, "training.eval_batches", t.eval_batches, "must be ≥ 1",
          "use e.g. 20");
  require(issues, t.log_interval >= 1, "training.log_interval", t.log_interval, "must be ≥ 1",
          "use 1");
  require(issues, t.seed >= 0, "training.seed", t.seed, "must be ≥ 0", "use e.g. 1337");
  // The upper bound: libgomp dies creating 100,000 threads (SIGSEGV in GOMP_parallel), and a
  // few thousand only crawl; 1024 is above the cores of any CPU node.
  require(issues, t.threads >= 0 && t.threads <= 1024, "training.threads", t.threads,
          "must be from 0 to 1024 (0 = cores / local ranks)",
          "leave it at 0, or set the cores each rank may use");
  require(issues, t.straggler_interval >= 0, "training.straggler_interval", t.straggler_interval,
          "must be ≥ 0 steps (0 = no straggler report)", "use 100");
  require(issues, t.straggler_threshold > 0.0, "training.straggler_threshold",
          t.straggler_threshold,
          "must be > 0 (a fraction of the median step time a rank's phase may exceed the median "
          "rank's by)",
          "use 0.2");
  require(issues, t.peak_flops_per_core > 0.0, "training.peak_flops_per_core",
          t.peak_flops_per_core, "must be > 0 (FLOP/s)", "use 2.19e11");
}

// ZeRO and mixed precision (parallel/dp/zero.h, docs/memory.md).
void check_memory_settings(const Config& config, std::vector<ConfigIssue>& issues) {
  const ParallelConfig& p = config.parallel;
  const TrainingConfig& t = config.training;
  require(issues, p.zero_stage >= 0 && p.zero_stage <= 3, "parallel.zero_stage", p.zero_stage,
          "must be 0, 1, 2 or 3 (ZeRO stages: 1 shards the optimizer state over dp, 2 also the "
          "gradients, 3 also the parameters)",
          "use 1 (or 3 for the least memory)");
  require(issues, p.zero_stage < 2 || p.pp_schedule != PipelineSchedule::zb_h1,
          "parallel.zero_stage", p.zero_stage,
          "ZeRO-2/3 reduce-scatter a layer's gradients when its backward ends, but zb_h1 computes "
          "the weight gradients later (backward_weight)",
          "use parallel.pp_schedule = \"1f1b\" with ZeRO-2/3, or parallel.zero_stage = 1");
  if (t.precision != Precision::fp16) return;  // the scaler settings only matter for fp16
  // fp16's largest finite value is 65504; a scale beyond 2^24 overflows the first gradient.
  require(issues, t.loss_scale_init >= 1.0 && t.loss_scale_init <= 16777216.0,
          "training.loss_scale_init", t.loss_scale_init, "must lie in [1, 2^24] under fp16",
          "use 65536");
  require(issues, t.loss_scale_growth > 1.0 && t.loss_scale_growth <= 1024.0,
          "training.loss_scale_growth", t.loss_scale_growth,
          "must lie in (1, 1024] (the scale must be able to grow back after a backoff, without "
          "jumping past the overflow point; it is capped at 2^24 in any case)",
          "use 2");
  require(issues, t.loss_scale_backoff > 0.0 && t.loss_scale_backoff < 1.0,
          "training.loss_scale_backoff", t.loss_scale_backoff,
          "must lie in (0, 1) (an overflow must lower the scale)", "use 0.5");
  require(issues, t.loss_scale_growth_interval >= 1, "training.loss_scale_growth_interval",
          t.loss_scale_growth_interval, "must be ≥ 1 step", "use 1000");
  require(issues, t.loss_scale_hysteresis >= 1, "training.loss_scale_hysteresis",
          t.loss_scale_hysteresis, "must be ≥ 1 (overflowing steps before the scale backs off)",
          "use 2");
}

// Checkpoints and the watchdog (checkpoint/sharded_checkpoint.h, monitor/watchdog.h).
void check_resilience(const Config& config, std::vector<ConfigIssue>& issues) {
  const CheckpointConfig& c = config.checkpoint;
  require(issues, c.interval >= 0, "checkpoint.interval", c.interval,
          "must be ≥ 0 steps (0 = no sharded checkpoints)", "use e.g. 100");
  require(issues, c.keep_last >= 1, "checkpoint.keep_last", c.keep_last,
          "must be ≥ 1 (the newest complete checkpoints kept)", "use 2");
  require(issues, c.resume.empty() || c.init_from.empty(), "checkpoint.init_from", c.init_from,
          "cannot be combined with checkpoint.resume (a checkpoint already holds the weights)",
          "drop one of checkpoint.init_from and checkpoint.resume");
  const ParallelConfig& p = config.parallel;
  require(issues, p.comm_timeout_s > 0.0 && p.comm_timeout_s <= 86400.0, "parallel.comm_timeout_s",
          p.comm_timeout_s,
          "must lie in (0, 86400] seconds (how long a collective, send/recv or wait may block "
          "before the watchdog ends the job)",
          "use 600");
  require(issues, p.flight_recorder_size >= 1 && p.flight_recorder_size <= 1000000,
          "parallel.flight_recorder_size", p.flight_recorder_size,
          "must lie in [1, 1000000] (operations kept for the watchdog's dump)", "use 256");
}

// One step fault of [fault_injection]: its step is −1 (never) or a step the run takes, so a
// rehearsal cannot silently not happen; when on, its rank exists in this world (an unused rank
// is not checked: the planner validates layouts of every world size with the faults off).
void check_step_fault(const Config& config, int world_size, std::string_view fault,
                      std::int64_t step, std::int64_t rank, std::vector<ConfigIssue>& issues) {
  const std::int64_t max_steps = config.training.max_steps;
  require(issues, step == -1 || (step >= 1 && step <= max_steps),
          fmt::format("fault_injection.{}_step", fault), step,
          fmt::format("must be -1 (never) or a step of the run, 1 … training.max_steps = {}",
                      max_steps),
          fmt::format("use -1, or e.g. {}", std::max<std::int64_t>(1, max_steps / 2)));
  if (step == -1) return;
  require(issues, rank >= 0 && rank < world_size, fmt::format("fault_injection.{}_rank", fault),
          rank, fmt::format("must be a world rank, 0 … {}", world_size - 1),
          fmt::format("use a rank below the {} of this job", world_size));
}

// [fault_injection] (docs/resilience.md, "Fault injection"); the value and phase names are
// checked when loaded.
void check_fault_injection(const Config& config, int world_size, std::vector<ConfigIssue>& issues) {
  const FaultInjectionConfig& f = config.fault_injection;
  check_step_fault(config, world_size, "nonfinite_grad", f.nonfinite_grad_step,
                   f.nonfinite_grad_rank, issues);
  check_step_fault(config, world_size, "kill", f.kill_step, f.kill_rank, issues);
  check_step_fault(config, world_size, "hang", f.hang_step, f.hang_rank, issues);
  // Alone, a hung rank has no peer whose watchdog could notice it: it would wait forever.
  require(issues, f.hang_step == -1 || world_size >= 2, "fault_injection.hang_step", f.hang_step,
          "needs a job of 2 or more ranks (the peers' watchdogs find a hung rank; one rank "
          "alone would sleep forever)",
          "use -1, or run the job on 2 or more ranks");
  require(issues, f.slow_rank >= -1 && f.slow_rank < world_size, "fault_injection.slow_rank",
          f.slow_rank, fmt::format("must be -1 (none) or a world rank, 0 … {}", world_size - 1),
          "use -1, or a rank of this job");
  require(issues,
          std::isfinite(f.slow_seconds) && f.slow_seconds >= 0.0 && f.slow_seconds <= 86400.0,
          "fault_injection.slow_seconds", f.slow_seconds,
          "must lie in [0, 86400] seconds (the sleep at the start of every slow_phase call)",
          "use e.g. 0.05");
}

// A token file is named inside data.dir: a plain file name, so no setting reads outside it.
void check_data_file_name(const std::string& setting, const std::string& name,
                          std::string_view example, std::vector<ConfigIssue>& issues) {
  const bool plain = !name.empty() && name != "." && name != ".." &&
                     name.find_first_of(std::string_view("/\0", 2)) == std::string::npos;
  require(issues, plain, setting, fmt::format("\"{}\"", name),
          "must be a file name inside data.dir (not empty, no '/', not . or ..)",
          fmt::format("set {} = \"{}\" and point data.dir at its directory", setting, example));
}

// data.* (docs/data.md): file names, the tokenizer setting, and the vocabulary that nanoGPT's
// and llm.c's files do not record: model.vocab_size or data.tokenizer must give it. Whether
// the tokenizer opens and agrees with model.vocab_size or meta.json needs its files, so
// load_run_metadata (train/train_data.h) checks that, still before anything is allocated.
void check_data(const Config& config, std::vector<ConfigIssue>& issues) {
  const DataConfig& d = config.data;
  check_data_file_name("data.train_file", d.train_file, "train.bin", issues);
  check_data_file_name("data.val_file", d.val_file, "val.bin", issues);
  // The char vocabulary is the set of a corpus's bytes: only meta.json can say which.
  require(issues, d.tokenizer != "char", "data.tokenizer", "\"char\"",
          "must be \"\", \"gpt2\", a directory holding encoder.json + vocab.bpe, or a "
          "SentencePiece .model: the char vocabulary is made from a corpus and lives in its "
          "meta.json",
          "set data.tokenizer = \"\" and train on meshtrain prepare's files");
  if (d.format != DataFormat::meshtrain) {
    require(issues, config.model.vocab_size > 0 || !d.tokenizer.empty(), "model.vocab_size",
            config.model.vocab_size,
            fmt::format("must be > 0 with data.format = \"{}\" and no data.tokenizer: its "
                        "token files do not record the vocabulary",
                        to_string(d.format)),
            "set data.tokenizer = \"gpt2\" (or a tokenizer directory or .model), or "
            "model.vocab_size to the tokenizer's vocabulary, e.g. 50257 for GPT-2 (nanoGPT "
            "pads it to 50304)");
  }
}

}  // namespace

std::vector<ConfigIssue> check_config(const Config& config, int world_size) {
  std::vector<ConfigIssue> issues;
  check_model(config.model, issues);
  check_parallel(config, world_size, issues);
  check_batch(config.training, config.parallel, issues);
  check_optimizer(config.training, issues);
  check_memory_settings(config, issues);
  check_resilience(config, issues);
  check_data(config, issues);
  check_fault_injection(config, world_size, issues);
  return issues;
}

void validate_or_throw(const Config& config, int world_size) {
  std::vector<ConfigIssue> issues = check_config(config, world_size);
  if (!issues.empty()) throw ConfigError(config.source, std::move(issues));
}

double estimated_training_bytes(const Config& config) {
  // Doubles: absurd sizes (n_embd = 1e9) must give a large number, not an int64 overflow.
  const ModelConfig& m = config.model;
  const bool llama = m.family == ModelFamily::llama;
  const double C = static_cast<double>(m.n_embd);
  const double L = static_cast<double>(m.n_layer);
  const double V = static_cast<double>(m.vocab_size);
  const double T = static_cast<double>(m.block_size);
  const double F = static_cast<double>(ffn_hidden_of(m));
  const double tp = static_cast<double>(std::max<std::int64_t>(config.parallel.tp, 1));
  const double kv =
      m.n_head >= 1 ? static_cast<double>(kv_heads_of(m)) / static_cast<double>(m.n_head) : 1.0;
  // Matrices are split over tp; norms, biases and positions are not (a few C per layer).
  const double matrices =
      L * (C * C * (2.0 + 2.0 * kv) + (llama ? 3.0 : 2.0) * C * F) + V * C * (llama ? 2.0 : 1.0);
  const double params = matrices / tp + (llama ? 0.0 : T * C) + L * 13.0 * C + 2.0 * C;
  const double tokens = static_cast<double>(config.training.micro_batch) * T;
  const double activations = 4.0 * tokens * (L * (10.0 * C + 2.0 * F) + 3.0 * C + 2.0 * V / tp);
  return model_state_bytes_per_parameter(config) * params + activations;
}

double model_state_bytes_per_parameter(const Config& config) {
  return model_state_bytes_by_category(config).total();
}

ModelStateBytes model_state_bytes_by_category(const Config& config) {
  // docs/memory.md: fp32 params, grads and Adam m, v are 4 + 4 + 8; mixed precision keeps
  // 16-bit params, fp32 grads and an fp32 master (counted as optimizer) besides m, v:
  // 2 + 4 + 12. ZeRO divides by N = dp what each stage shards.
  const double n = static_cast<double>(std::max<std::int64_t>(config.parallel.dp, 1));
  const bool mixed = config.training.precision != Precision::fp32;
  const double param = mixed ? 2.0 : 4.0, grad = 4.0, optim = mixed ? 12.0 : 8.0;
  switch (config.parallel.zero_stage) {
    case 1:
      return {.params = param, .grads = grad, .optimizer = optim / n};
    case 2:
      return {.params = param, .grads = grad / n, .optimizer = optim / n};
    case 3:
      // fp32: the persistent parameter is the master slice itself (params 4/N); mixed: the
      // 16-bit values exist only while a unit is gathered (comm), the master is optimizer.
      return {.params = mixed ? 0.0 : 4.0 / n, .grads = grad / n, .optimizer = optim / n};
    default:
      return {.params = param, .grads = grad, .optimizer = optim};
  }
}

std::vector<ConfigIssue> check_memory(const Config& config, std::int64_t available_bytes) {
  const double need = estimated_training_bytes(config);
  if (available_bytes <= 0 || need <= static_cast<double>(available_bytes)) return {};
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return {{"model and training.micro_batch",
           fmt::format("n_layer {}, n_embd {}, block_size {}, micro_batch {}", config.model.n_layer,
                       config.model.n_embd, config.model.block_size, config.training.micro_batch),
           fmt::format("need ≈ {:.3g} GiB per rank ({:.3g} B per parameter for weights, gradients "
                       "and Adam state at ZeRO-{} in {}, plus activations), more than the {:.1f} "
                       "GiB available",
                       need / kGiB, model_state_bytes_per_parameter(config),
                       config.parallel.zero_stage, to_string(config.training.precision),
                       static_cast<double>(available_bytes) / kGiB),
           "reduce model.n_layer, model.n_embd, model.block_size or training.micro_batch, or "
           "shard the model state with parallel.zero_stage (and parallel.dp)"}};
}

std::int64_t kv_heads_of(const ModelConfig& m) { return m.n_kv_head > 0 ? m.n_kv_head : m.n_head; }

std::int64_t ffn_hidden_of(const ModelConfig& m) {
  if (m.ffn_hidden > 0) return m.ffn_hidden;
  if (m.family != ModelFamily::llama)
    return 4 * std::min<std::int64_t>(m.n_embd, std::int64_t{1} << 40);
  // Llama's reference code: 2/3 of 4·C (SwiGLU has three matrices instead of two, so the same
  // parameter count), rounded up to a multiple of 256.
  constexpr std::int64_t kMultipleOf = 256;
  // Clamped so that an absurd n_embd (rejected by the memory check) cannot overflow.
  const std::int64_t c = std::min<std::int64_t>(m.n_embd, std::int64_t{1} << 40);
  const std::int64_t f = 2 * (4 * c) / 3;
  return (f + kMultipleOf - 1) / kMultipleOf * kMultipleOf;
}

std::int64_t moe_ffn_hidden_of(const ModelConfig& m) {
  return m.moe_ffn_hidden > 0 ? m.moe_ffn_hidden : ffn_hidden_of(m);
}

bool overlap_grad_reduce(const ParallelConfig& p) {
  return p.overlap_grad_reduce && p.pp_schedule != PipelineSchedule::zb_h1;
}

std::int64_t global_batch_of(const Config& config) {
  return config.training.micro_batch * config.training.accumulation * config.parallel.dp;
}

double scaled_peak_lr(const Config& config) {
  const TrainingConfig& t = config.training;
  const double ratio =
      static_cast<double>(global_batch_of(config)) / static_cast<double>(t.lr_base_batch);
  switch (t.lr_scaling) {
    case LrScaling::linear:
      return t.lr * ratio;
    case LrScaling::sqrt:
      return t.lr * std::sqrt(ratio);
    case LrScaling::none:
      break;
  }
  return t.lr;
}

}  // namespace meshtrain
