#include "meshtrain/plan/accounting.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/config/validate.h"
#include "meshtrain/plan/context_parallel.h"
#include "meshtrain/plan/formulas.h"
#include "meshtrain/plan/moe.h"

namespace meshtrain::plan {
namespace {

double f(std::int64_t v) { return static_cast<double>(v); }

bool mixed(const Config& c) { return c.training.precision != Precision::fp32; }

// Bytes of one element of the compute dtype (d in docs/memory.md).
double compute_bytes(const Config& c) { return mixed(c) ? 2.0 : 4.0; }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// fp32 [b·s/cp (/tp with sp), h]: StageRunner::boundary_shape (train/stage_runner.cpp); a cp
// rank passes on the activations of its own s/cp tokens.
double pp_payload_bytes(const Config& c) {
  const double tokens = local_tokens(c);
  return tokens * f(c.model.n_embd) * 4.0 / (c.parallel.sequence_parallel ? f(c.parallel.tp) : 1.0);
}

// Sends per micro-batch: an activation out of every local chunk but the model's last, a
// gradient out of every local chunk but the model's first.
double pp_sends_per_micro_batch(const Config& c, const ParameterCounts& sp) {
  const double v = f(c.parallel.virtual_stages);
  return (v - (sp.last ? 1.0 : 0.0)) + (v - (sp.first ? 1.0 : 0.0));
}

// Collectives the dp bytes are split over, each paying the per-step latency: buckets of
// TimeSettings::dp_bucket_bytes, else parallel.bucket_mib (parallel/dp) ...
double bucket_count(double bytes, const Config& c, const TimeSettings& time) {
  const double bucket = time.dp_bucket_bytes > 0.0 ? time.dp_bucket_bytes
                                                   : f(c.parallel.bucket_mib) * 1024.0 * 1024.0;
  return std::max(1.0, std::ceil(bytes / bucket));
}

// ... or hook units (ZeRO-2/3: a block, the embeddings, the head).
double unit_count(const ParameterCounts& sp) {
  return std::max(1.0, f(sp.layers) + (sp.first ? 1.0 : 0.0) + (sp.last ? 1.0 : 0.0));
}

}  // namespace

MemoryBreakdown model_state_bytes(const Config& config, double params) {
  // ZeRO shards over the dp × cp group: config/validate.h's per-parameter bytes with N = dp·cp.
  Config zero_group = config;
  zero_group.parallel.dp = reduction_group_size(config);
  const ModelStateBytes per = model_state_bytes_by_category(zero_group);
  MemoryBreakdown out;
  out.params = per.params * params;
  out.grads = per.grads * params;
  out.optimizer = per.optimizer * params;
  return out;
}

double activation_bytes_per_block(const Config& config) {
  const ModelConfig& m = config.model;
  const bool llama = m.family == ModelFamily::llama, sp = config.parallel.sequence_parallel;
  const double t = f(config.parallel.tp), h = f(m.n_embd), a = f(m.n_head);
  const double kv = f(kv_heads_of(m)) * h / a, F = f(ffn_hidden_of(m));
  // Every term is per token of this rank: b·s/cp under context parallelism (the lse too).
  const double tokens = local_tokens(config);
  const double stats = llama ? 1.0 : 2.0;  // RMSNorm 1/rms; LayerNorm mean and 1/σ
  const double split = sp ? t : 1.0;       // what sequence parallelism divides by t
  // docs/memory.md, "What each layer keeps": elements per token, kept in fp32 ...
  // The MLP's share, averaged over the blocks (plan/moe.h): a MoE block keeps, per token and
  // assignment (k of them, uniform dropless routing), its expert's gate and up (2·F_moe, whole:
  // expert tp = 1), its packed input row (C) and hidden output (F_moe), plus the router's logits
  // and probabilities (2E).
  const double moe_share = f(moe_layers_in(m, 0, m.n_layer)) / f(m.n_layer);
  const double k = f(m.moe_top_k), Fm = f(moe_ffn_hidden_of(m)), E = f(m.moe_experts);
  const double mlp_fp32 = (1.0 - moe_share) * (llama ? 2.0 : 1.0) * F / t +
                          moe_share * (2.0 * k * Fm + 2.0 * E);
  const double mlp_linear = (1.0 - moe_share) * F / t + moe_share * (k * Fm + k * h);
  const double fp32_elements = (2.0 * h + 2.0 * stats) / split  // block input, residual, stats
                               + (h + 2.0 * kv + a) / t         // q, k, v; log-sum-exp
                               + h / t                          // attention output
                               + mlp_fp32;                      // gelu pre-act | gate, up
  // ... and the linear layers' inputs (docs/mixed_precision.md, "Memory": 16-bit under
  // bf16/fp16; the attention output is also kept by the output projection in 16 bits).
  // Ulysses keeps the core's head-sharded copies of q, k|v and the output (the same number of
  // elements as the local ones; dropped with the core's output under selective recompute).
  const bool ulysses = config.parallel.cp > 1 && config.parallel.cp_comm == CpCommMode::a2a &&
                       config.training.recompute == RecomputeMode::none;
  const double fp32_all = fp32_elements + (ulysses ? (2.0 * h + 2.0 * kv) / t : 0.0);
  const double linear_inputs = 2.0 * h + mlp_linear;  // qkv input, MLP input, its hidden output
  const double lin = mixed(config) ? 2.0 : 4.0;
  double bytes = 4.0 * fp32_all + lin * linear_inputs + (mixed(config) ? 2.0 * h / t : 0.0);
  // Selective drops the attention core's output and log-sum-exp, and under 16 bits the
  // output projection's 16-bit copy of that output with them (measured: 784 B per block and
  // token fewer on the main job in bf16 = 4(h + a) + 2h; docs/memory.md has 4(h + a) for fp32).
  if (config.training.recompute == RecomputeMode::selective) {
    bytes -= 4.0 * (h + a) / t + (mixed(config) ? 2.0 * h / t : 0.0);
  }
  if (config.training.recompute == RecomputeMode::full) bytes = 4.0 * h / split;
  return bytes * tokens;
}

double activation_peak_bytes(const Config& config, const ParameterCounts& stage_params,
                             std::int64_t stage) {
  const ModelConfig& m = config.model;
  const ParallelConfig& p = config.parallel;
  const bool llama = m.family == ModelFamily::llama, sp = p.sequence_parallel;
  const double t = f(p.tp), h = f(m.n_embd), F = f(ffn_hidden_of(m));
  const double tokens = local_tokens(config);
  const double x = sp ? h / t : h;  // a block input, per token
  const double g_mlp = F / t + (sp ? h : 0.0);
  const double lin = mixed(config) ? 2.0 : 4.0;
  const double g_head_bytes =
      stage_params.last
          ? 4.0 * ((llama ? 1.0 : 2.0) + f(ceil_div(m.vocab_size, p.tp)) + 1.0 + h) + lin * h
          : 0.0;
  const double in_flight = in_flight_micro_batches(p.pp_schedule, p.pp, stage,
                                                   config.training.accumulation, p.virtual_stages);
  const double L = f(stage_params.layers);
  Config no_recompute = config;
  no_recompute.training.recompute = RecomputeMode::none;
  if (config.training.recompute == RecomputeMode::full) {
    // 4bs·[L·x + max(A + G_mlp, x + G_head)], the saved inputs times the micro-batches in flight.
    const double a_full = activation_bytes_per_block(no_recompute);
    return in_flight * 4.0 * tokens * L * x +
           std::max(a_full + 4.0 * tokens * g_mlp, 4.0 * tokens * x + tokens * g_head_bytes);
  }
  // 4bs·[x + L·A + max(G_mlp, G_head)]
  return in_flight * (4.0 * tokens * x + L * activation_bytes_per_block(config)) +
         tokens * std::max(4.0 * g_mlp, g_head_bytes);
}

double comm_buffer_bytes(const Config& config, const ParameterCounts& sp) {
  return tp_comm_buffer_bytes(config, sp) + dp_comm_buffer_bytes(config, sp) +
         cp_comm_buffer_bytes(config);
}

double tp_comm_buffer_bytes(const Config& config, const ParameterCounts& sp) {
  const ParallelConfig& p = config.parallel;
  if (!p.sequence_parallel || p.tp <= 1) return 0.0;
  // The tp group's ring scratch: one block of the activation reduce-scatter, [b·s/t, h] fp32
  // (comm/mpi_process_group.cpp); and the packed replicated gradients of the sequence-parallel
  // sum (parallel/tp/replicated_grads.h), this rank's slices of them under ZeRO ≥ 1.
  const double block = local_tokens(config) / f(p.tp) * f(config.model.n_embd);
  const double replicated =
      p.zero_stage >= 1 ? sp.replicated / f(reduction_group_size(config)) : sp.replicated;
  return 4.0 * block + 4.0 * replicated;
}

double dp_comm_buffer_bytes(const Config& config, const ParameterCounts& sp) {
  const std::int64_t stage = config.parallel.zero_stage;
  // ZeRO shards over the dp × cp group (N = dp·cp).
  const double n = f(reduction_group_size(config)), d = compute_bytes(config);
  if (stage == 0 || reduction_group_size(config) <= 1) return 0.0;
  const double bucket = f(config.parallel.bucket_mib) * 1024.0 * 1024.0;
  const double psi_rs = std::min(sp.total, bucket / 4.0);  // reduce-scatter bucket (fp32)
  const double psi_ag = std::min(sp.total, bucket / d);    // all-gather bucket (d bytes)
  const double psi_u = sp.largest_unit, psi_s = sp.tied_extra;
  // A reduce-scatter slot (parallel/dp/zero_reduce.h) of `in` input bytes: its output is 1/N of
  // that. Slot 0 also receives (input) and sends (output) the all-gathers of stages 1–2. With
  // overlap a second slot holds the next reduce-scatter while the first is in flight, once a
  // step posts two or more: stage 1's buckets, stages 2–3's units × micro-batches.
  const auto slot = [n](double in) { return in * (1.0 + 1.0 / n); };
  const bool overlap = overlap_grad_reduce(config.parallel);
  const double units = f(sp.layers) + (sp.first ? 1.0 : 0.0) + (sp.last ? 1.0 : 0.0);
  if (stage == 1) {
    const bool second = overlap && 4.0 * sp.total > bucket;
    return slot(std::max(4.0 * psi_rs, d * psi_ag)) + (second ? slot(4.0 * psi_rs) : 0.0);
  }
  const bool second = overlap && units * f(config.training.accumulation) >= 2.0;
  const double extra = second ? slot(4.0 * psi_u) : 0.0;
  if (stage == 2) {
    return 4.0 * psi_u + slot(std::max(4.0 * psi_u, d * psi_ag)) + extra + 4.0 * psi_s;
  }
  // Gathered values dΨ_u, the unit's gradient 4Ψ_u, a slot, the prefetched unit's send and
  // receive dΨ_u/N + dΨ_u.
  return psi_u * (2.0 * d + 4.0) + slot(4.0 * psi_u) + d * psi_u / n + extra + 4.0 * psi_s;
}

double dp_bytes_per_step(const Config& config, const ParameterCounts& sp) {
  // Gradients are reduced, and ZeRO shards, over the dp × cp group (N = dp·cp).
  const double n = f(reduction_group_size(config)), d = compute_bytes(config);
  const double m = f(config.training.accumulation), psi = sp.total;
  if (reduction_group_size(config) <= 1) return 0.0;
  switch (config.parallel.zero_stage) {
    case 0:
      return 4.0 * psi + 8.0;
    case 1:
      return 4.0 * psi + d * psi / n + 16.0;
    case 2:
      return m * 4.0 * psi + d * psi / n + 16.0;
    default:
      return m * (4.0 * psi + 2.0 * d * (psi + sp.tied_extra) / n) + 16.0;
  }
}

double tp_tensors_per_micro_batch(const Config& config, const ParameterCounts& sp) {
  const double per_layer = config.training.recompute == RecomputeMode::full ? 6.0 : 4.0;
  return per_layer * f(sp.layers) + (sp.first ? 1.0 : 0.0) + (sp.last ? 1.0 : 0.0);
}

double tp_bytes_per_step(const Config& config, const ParameterCounts& sp) {
  const ParallelConfig& p = config.parallel;
  if (p.tp <= 1) return 0.0;
  const double n = local_tokens(config);
  const double D = n * f(config.model.n_embd) * 4.0;  // fp32 linear outputs, every precision
  const double tensors = tp_tensors_per_micro_batch(config, sp);
  const double per_tensor = p.sequence_parallel ? D * (1.0 + 1.0 / f(p.tp)) : D;
  const double loss = sp.last ? 12.0 * n : 0.0;  // max (4n) and Σexp, target (8n)
  // Under ZeRO ≥ 1 the sequence-parallel sum covers this rank's slices of the replicated
  // parameters only (exact when each divides by dp, else within a few elements per tensor).
  const double replicated =
      p.sequence_parallel
          ? 4.0 * sp.replicated / (p.zero_stage >= 1 ? f(reduction_group_size(config)) : 1.0)
          : 0.0;
  return f(config.training.accumulation) * (tensors * per_tensor + loss) + 8.0 + replicated;
}

double pp_bytes_per_step(const Config& config, const ParameterCounts& sp) {
  const ParallelConfig& p = config.parallel;
  if (p.pp <= 1) return 0.0;
  // ProcessGroup counts a p2p transfer on both sides (send and recv each count their buffer),
  // and every send of a rank is matched by a receive of the same shape (an activation in for
  // each activation out, a gradient in for each gradient out). The scalars: the step's span
  // (all-reduce max, 4 B), its bubble, the loss and the grad norm's square sum (8 B each).
  // gpt2's tied-embedding sum runs on its own group (first and last stage), not this one.
  return 2.0 * f(config.training.accumulation) * pp_sends_per_micro_batch(config, sp) *
             pp_payload_bytes(config) +
         28.0;
}

// --- Wire time: formulas.h's ring formulas on the axis's link, for the collectives whose
// bytes the functions above count. ---

double dp_time_per_step(const Config& c, const ParameterCounts& sp, const Link& link,
                        const TimeSettings& time) {
  const std::int64_t n = reduction_group_size(c);
  if (n <= 1) return 0.0;
  const double d = compute_bytes(c), m = f(c.training.accumulation), psi = sp.total;
  const double g = time.gradient_wire_bytes;  // 4: meshtrain's fp32 gradients
  const double B = link.bandwidth_bytes_per_s, a = link.latency_s;
  // k collectives of bytes/k each: the bandwidth term once, the latency term k times.
  auto ar = [&](double bytes, double k) { return k * all_reduce_s(bytes / k, n, B, a); };
  auto rs = [&](double bytes, double k) { return k * reduce_scatter_s(bytes / k, n, B, a); };
  auto ag = [&](double bytes, double k) { return k * all_gather_s(bytes / k, n, B, a); };
  const double units = unit_count(sp);
  switch (c.parallel.zero_stage) {
    case 0:
      return ar(g * psi, bucket_count(g * psi, c, time));
    case 1:
      return rs(g * psi, bucket_count(g * psi, c, time)) +
             ag(d * psi, bucket_count(d * psi, c, time));
    case 2:
      return m * rs(g * psi, units) + ag(d * psi, bucket_count(d * psi, c, time));
    default:
      return m * (rs(g * psi, units) + 2.0 * ag(d * (psi + sp.tied_extra), units));
  }
}

double tp_time_per_step(const Config& c, const ParameterCounts& sp, const Link& link,
                        const TimeSettings& time) {
  const std::int64_t t = c.parallel.tp;
  if (t <= 1) return 0.0;
  const double B = link.bandwidth_bytes_per_s, a = link.latency_s;
  const double n = local_tokens(c);
  const double D = n * f(c.model.n_embd) * time.activation_wire_bytes;
  const double per_tensor = c.parallel.sequence_parallel
                                ? reduce_scatter_s(D, t, B, a) + all_gather_s(D, t, B, a)
                                : all_reduce_s(D, t, B, a);
  const double loss =
      sp.last ? all_reduce_s(4.0 * n, t, B, a) + all_reduce_s(8.0 * n, t, B, a) : 0.0;
  return f(c.training.accumulation) * (tp_tensors_per_micro_batch(c, sp) * per_tensor + loss);
}

double pp_time_per_step(const Config& c, const ParameterCounts& sp, const Link& link,
                        const TimeSettings& time, const Link& intra_node) {
  if (c.parallel.pp <= 1) return 0.0;
  // With scatter/gather (and no sp, which already splits the tensor over tp) each tp rank sends
  // 1/t of the boundary tensor and the receivers all-gather it over the intra-node link.
  const double t = f(c.parallel.tp);
  const double tokens = local_tokens(c);
  const double whole = tokens * f(c.model.n_embd) * time.activation_wire_bytes;
  const bool split = c.parallel.sequence_parallel || (time.pp_scatter_gather && t > 1.0);
  const double payload = split ? whole / t : whole;
  const double gather = time.pp_scatter_gather && !c.parallel.sequence_parallel
                            ? all_gather_s(whole, c.parallel.tp, intra_node.bandwidth_bytes_per_s,
                                           intra_node.latency_s)
                            : 0.0;
  return f(c.training.accumulation) * pp_sends_per_micro_batch(c, sp) *
         (p2p_s(payload, link.bandwidth_bytes_per_s, link.latency_s) + gather);
}

}  // namespace meshtrain::plan
