// account(): one layout's plan, built from the formulas of accounting.cpp and formulas.cpp on
// the parameter counts of parameters.cpp (the placement table), with every quantity recorded
// as a named Term for --explain and --json.
#include <fmt/format.h>

#include <algorithm>

#include "meshtrain/config/validate.h"
#include "meshtrain/plan/accounting.h"
#include "meshtrain/plan/context_parallel.h"
#include "meshtrain/plan/formulas.h"
#include "meshtrain/plan/moe.h"

namespace meshtrain::plan {
namespace {

double f(std::int64_t v) { return static_cast<double>(v); }

const char* link_name(LinkKind kind) {
  return kind == LinkKind::intra_node ? "intra-node" : "inter-node";
}

// The collectives behind dp_time_per_step, for --explain.
std::string dp_time_formula(std::int64_t zero_stage, double g) {
  switch (zero_stage) {
    case 0:
      return fmt::format("all-reduce of {0}Ψ per bucket: 2(N−1)/N·{0}Ψ/B + 2(N−1)α each", g);
    case 1:
      return fmt::format(
          "reduce-scatter of {0}Ψ + all-gather of dΨ (buckets): (N−1)/N·({0}Ψ + dΨ)/B + latencies",
          g);
    case 2:
      return fmt::format("m reduce-scatters of {}Ψ (one per unit) + all-gather of dΨ", g);
    default:
      return fmt::format("m·(reduce-scatter of {}Ψ + 2 all-gathers of dΨ′), one per unit", g);
  }
}

// One axis's bytes and wire time for one pipeline stage (accounting.h, context_parallel.h).
struct AxisCost {
  double bytes = 0.0, seconds = 0.0;
};

AxisCost axis_cost(Axis axis, const Config& c, const ParameterCounts& sp,
                   const Link& link, const TimeSettings& time, const ClusterSpec& cluster) {
  if (axis == Axis::dp) return {dp_bytes_per_step_moe(c, sp), dp_time_per_step_moe(c, sp, link, time)};
  if (axis == Axis::ep) return {ep_bytes_per_step(c, sp), ep_time_per_step(c, sp, link)};
  if (axis == Axis::tp) return {tp_bytes_per_step(c, sp), tp_time_per_step(c, sp, link, time)};
  if (axis == Axis::cp) return {cp_bytes_per_step(c, sp), cp_time_per_step(c, sp, link, time)};
  return {pp_bytes_per_step(c, sp), pp_time_per_step(c, sp, link, time, cluster.intra_node)};
}

std::string axis_formula(Axis axis, const Config& c, const TimeSettings& time) {
  if (axis == Axis::dp) {
    const std::string dense = dp_time_formula(c.parallel.zero_stage, time.gradient_wire_bytes);
    return c.model.moe_experts > 0
               ? fmt::format("dense Ψ over dp·cp: {}; + the same for the experts' Ψ_e over the "
                             "(dp·cp)/ep = {} expert-data-parallel ranks",
                             dense, expert_group_size(c))
               : dense;
  }
  if (axis == Axis::ep) return ep_time_formula(c);
  if (axis == Axis::cp) return cp_time_formula(c);
  if (axis == Axis::tp) {
    const char* k = c.training.recompute == RecomputeMode::full ? "6L+2" : "4L+2";
    const char* tokens = c.parallel.cp > 1 ? "b·(s/cp)" : "b·s";
    return c.parallel.sequence_parallel
               ? fmt::format(
                     "m·({})·(reduce-scatter + all-gather of D = {}·h·{}): "
                     "(N−1)/N·D/B each",
                     k, tokens, time.activation_wire_bytes)
               : fmt::format("m·({}) all-reduces of D = {}·h·{}: 2(N−1)/N·D/B + 2(N−1)α each", k,
                             tokens, time.activation_wire_bytes);
  }
  return fmt::format(
      "m·(sends per micro-batch) p2p of {}·h·{} (/tp with sp{}): D/B + α each",
      c.parallel.cp > 1 ? "b·(s/cp)" : "b·s", time.activation_wire_bytes,
      time.pp_scatter_gather ? "; scatter/gather: /tp, + intra-node all-gather" : "");
}

// The MoE terms of the fullest rank (plan/moe.h), for --explain.
void add_moe_terms(std::vector<Term>& terms, const Config& c, const ParameterCounts& sp,
                   const ModelSize& size) {
  const ModelConfig& m = c.model;
  if (!is_moe(m)) return;
  const std::int64_t E = m.moe_experts, ep = c.parallel.ep;
  terms.push_back({"model parameters (total)",
                   fmt::format("every expert: {} MoE blocks of {} experts × 3·C·F_moe (F_moe = {})",
                               moe_layers_in(m, 0, m.n_layer), E, moe_ffn_hidden_of(m)),
                   size.parameters, "elements"});
  terms.push_back({"active parameters per token",
                   fmt::format("total − (E − k)·3·C·F_moe per MoE block (k = {})", m.moe_top_k),
                   size.active_parameters, "elements"});
  terms.push_back(
      {"Ψ_e (expert parameters on the fullest rank)",
       fmt::format("{} MoE blocks × E/ep = {} experts × 3·C·F_moe, whole on each tp rank; "
                   "gradients and ZeRO over (dp·cp)/ep = {} ranks",
                   sp.moe_layers, E / std::max<std::int64_t>(ep, 1), expert_group_size(c)),
       sp.experts, "elements"});
  if (ep <= 1) return;
  const EpLayerTraffic t = ep_layer_traffic(c);
  terms.push_back({"ep rows per MoE block and micro-batch",
                   fmt::format("N·k = {:.0f}·{} sent (uniform routing), (ep−1)/ep = {:.0f} of them "
                               "leave the rank; received ≤ {:.0f}{}",
                               t.tokens, m.moe_top_k, t.rows_leaving, t.rows_received_bound,
                               m.moe_capacity_factor > 0.0 ? " (E·⌈N·k/E·f⌉)" : " (dropless: ep·N·k)"),
                   t.rows_sent, "rows"});
}

std::string gib(double bytes) {
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace

Plan account(const ModelConfig& model, const Layout& layout, const TrainingSettings& settings,
             const ClusterSpec& cluster, const TimeSettings& time) {
  ParameterCountCache counts;
  return account(model, layout, settings, cluster, time, counts);
}

Plan account(const ModelConfig& model, const Layout& layout, const TrainingSettings& settings,
             const ClusterSpec& cluster, const TimeSettings& time, ParameterCountCache& cache) {
  Plan plan;
  plan.layout = layout;
  plan.config = to_config(model, layout, settings);
  const Config& c = plan.config;
  const ModelConfig& m = c.model;
  std::vector<Term>& terms = plan.terms;
  auto term = [&](std::string name, std::string formula, double value, std::string unit) {
    terms.push_back({std::move(name), std::move(formula), value, std::move(unit)});
  };

  // Memory, per pipeline rank; the layout needs what its fullest rank needs.
  const std::vector<ParameterCounts>& counts = cache.stages(c);
  const ModelSize& size = cache.model(m);
  for (std::int64_t s = 0; s < layout.pp; ++s) {
    const ParameterCounts& sp = counts[static_cast<std::size_t>(s)];
    MemoryBreakdown mem = model_state_bytes_moe(c, sp);
    mem.stage = s;
    mem.activations = activation_peak_bytes(c, sp, s);
    mem.comm = comm_buffer_bytes_moe(c, sp);
    plan.stages.push_back(mem);
  }
  const auto peak =
      std::max_element(plan.stages.begin(), plan.stages.end(),
                       [](const auto& a, const auto& b) { return a.total() < b.total(); });
  plan.peak = *peak;
  const ParameterCounts& psp = counts[static_cast<std::size_t>(plan.peak.stage)];
  const double usable = time.usable_memory_fraction * cluster.memory_bytes;
  plan.fits = plan.peak.total() <= usable;
  const ModelStateBytes per = model_state_bytes_by_category(c);
  term("Ψ (parameters on the fullest rank)",
       fmt::format("stage {} of {}: {} blocks /tp, embeddings ⌈V/t⌉·h, head; norms whole",
                   plan.peak.stage, layout.pp, psp.layers),
       psp.total, "elements");
  add_moe_terms(terms, c, psp, size);
  term("params",
       fmt::format("{}·Ψ (ZeRO-{}, {})", per.params, layout.zero_stage,
                   to_string(settings.precision)),
       plan.peak.params, "B");
  term("grads", fmt::format("{:.4g}·Ψ (fp32 gradients)", per.grads), plan.peak.grads, "B");
  term("optimizer",
       fmt::format("{:.4g}·Ψ (Adam m, v{})", per.optimizer,
                   settings.precision == Precision::fp32 ? "" : ", fp32 master"),
       plan.peak.optimizer, "B");
  term("activations",
       fmt::format("in-flight({}) · (4bs·x + L·A) + transient{}; A = {:.0f} B per block "
                   "(recompute {}, sp {})",
                   to_string(layout.schedule),
                   layout.cp > 1 ? fmt::format(", s/cp = {} tokens", m.block_size / layout.cp) : "",
                   activation_bytes_per_block(c), to_string(layout.recompute),
                   layout.sequence_parallel),
       plan.peak.activations, "B");
  term(
      "comm buffers",
      layout.cp > 1
          ? fmt::format("ZeRO buckets / units over dp·cp = {}; + {} (cp {})", layout.dp * layout.cp,
                        layout.cp_comm == CpCommMode::a2a ? "one layer's q, k, v in flight"
                                                          : "4 ring blocks of K,V / dK,dV",
                        to_string(layout.cp_comm))
          : "ZeRO buckets / units (docs/memory.md, Communication buffers)",
      plan.peak.comm, "B");
  term("memory per device",
       fmt::format("params + grads + optimizer + activations + comm ≤ "
                   "{:.2f} × {}",
                   time.usable_memory_fraction, gib(cluster.memory_bytes)),
       plan.peak.total(), "B");

  // Communication per axis (the slowest stage of each axis). Rank order (p, d, c, t): the
  // gradient group dp × cp is contiguous at stride tp, the cp ring sits between tp and dp.
  struct AxisSpec {
    Axis axis;
    std::int64_t size, stride;
  };
  const AxisSpec axes[] = {{Axis::dp, layout.dp * layout.cp, layout.tp},
                           {Axis::tp, layout.tp, 1},
                           {Axis::pp, layout.pp, layout.tp * layout.cp * layout.dp},
                           {Axis::cp, layout.cp, layout.tp},
                           // ep: consecutive dp ranks of a dp × cp group (mesh/placement.h)
                           {Axis::ep, layout.ep, layout.tp * layout.cp}};
  double dp_s = 0.0, cp_s = 0.0, other_s = 0.0;
  for (const AxisSpec& a : axes) {
    if (a.size <= 1) continue;
    AxisComm ax{.axis = a.axis, .size = a.size, .link = link_of_group(a.size, a.stride, cluster)};
    // A ring collective drives every NIC its ranks have in a node; a point-to-point message (a
    // pipeline send, a ring-attention step) and an all-to-all's share of one rank go over that
    // rank's own NIC only (with pp_scatter_gather the tp ranks of a stage each send their part,
    // which pp_time_per_step accounts for).
    const bool own_nic = ax.axis == Axis::pp || ax.axis == Axis::cp || ax.axis == Axis::ep;
    const Link link = own_nic && ax.link == LinkKind::inter_node
                          ? cluster.inter_node
                          : link_of_group_bandwidth(a.size, a.stride, cluster);
    for (const ParameterCounts& sp : counts) {
      const AxisCost cost = axis_cost(ax.axis, c, sp, link, time, cluster);
      ax.bytes_per_step = std::max(ax.bytes_per_step, cost.bytes);
      ax.time_s = std::max(ax.time_s, cost.seconds);
    }
    term(fmt::format("{} bytes per step", to_string(ax.axis)), "as ProcessGroup counts them (max over stages)",
         ax.bytes_per_step, "B");
    term(fmt::format("{} time per step", to_string(ax.axis)),
         fmt::format("{} on the {} link ({:.3g} GB/s, {:.3g} µs), N = {}",
                     axis_formula(ax.axis, c, time), link_name(ax.link),
                     link.bandwidth_bytes_per_s / 1e9, link.latency_s * 1e6, ax.size),
         ax.time_s, "s");
    (ax.axis == Axis::dp ? dp_s : ax.axis == Axis::cp ? cp_s : other_s) += ax.time_s;
    plan.comm.push_back(ax);
  }

  // Compute, bubble, step.
  const double tokens = f(settings.global_batch) * f(m.block_size);
  const double model_flops =
      model_flops_per_token(size.matmul_parameters, m.n_layer, m.n_embd, m.block_size);
  const double hw_flops =
      hardware_flops_per_token(size.matmul_parameters, size.block_matmul_parameters, m.n_layer,
                               m.n_embd, m.block_size, layout.recompute);
  const double peak_flops = peak_flops_for(cluster, to_string(settings.precision));
  const double efficiency = time.efficiency > 0.0 ? time.efficiency : cluster.default_efficiency;
  const double devices = f(layout.devices());
  plan.compute_s = hw_flops * tokens / (devices * peak_flops * efficiency);
  // The s² attention-score traffic of the fullest stage (implementations that materialise it).
  const bool recomputed_forward = layout.recompute != RecomputeMode::none;
  const double score_bytes = time.attention_score_bytes_forward * (recomputed_forward ? 2.0 : 1.0) +
                             time.attention_score_bytes_backward;
  std::int64_t stage_layers = 0;
  for (const ParameterCounts& sp : counts) stage_layers = std::max(stage_layers, sp.layers);
  plan.attention_score_s =
      // A cp rank scores its s/cp queries against all s keys: s²/cp per head, folded into the
      // heads per rank.
      attention_score_s(score_bytes, stage_layers, f(m.n_head) / f(layout.tp) / f(layout.cp),
                        layout.micro_batch, m.block_size, layout.accumulation,
                        cluster.memory_bandwidth_bytes_per_s);
  plan.bubble = bubble_fraction(layout.schedule, layout.pp, layout.accumulation, layout.v);
  plan.exposed_comm_s = other_s + (1.0 - time.cp_overlap) * cp_s + (1.0 - time.dp_overlap) * dp_s;
  plan.step_s =
      (plan.compute_s + plan.attention_score_s) / (1.0 - plan.bubble) + plan.exposed_comm_s;
  plan.tokens_per_s = tokens / plan.step_s;
  plan.mfu = model_flops * tokens / (plan.step_s * devices * peak_flops);

  term("model FLOPs per token", "6·Ψ_mm + 12·L·h·s (Ψ_mm: block linears + LM head)", model_flops,
       "FLOP");
  term("hardware FLOPs per token",
       fmt::format("model + recompute {} (full: + 2·Ψ_blocks + 4·L·h·s; selective: + 4·L·h·s)",
                   to_string(layout.recompute)),
       hw_flops, "FLOP");
  term("tokens per step", "global batch × s", tokens, "tokens");
  term("compute time",
       fmt::format("hardware FLOPs · tokens / (devices · {:.4g} FLOP/s · {:.2f})", peak_flops,
                   efficiency),
       plan.compute_s, "s");
  term("attention-score traffic",
       fmt::format("{:.4g} B per score element (forward{}, backward) · L · (a/t) · b · s² · m / "
                   "{:.4g} B/s",
                   score_bytes, recomputed_forward ? " ×2 with recompute" : "",
                   cluster.memory_bandwidth_bytes_per_s),
       plan.attention_score_s, "s");
  term("bubble",
       fmt::format("{}, p = {}, m = {}, v = {}", bubble_formula(layout.schedule), layout.pp,
                   layout.accumulation, layout.v),
       plan.bubble, "");
  term("exposed comm",
       layout.cp > 1 ? fmt::format("tp + pp + (1 − {:.2f})·cp + (1 − {:.2f})·dp (no overlap but "
                                   "the stated ones)",
                                   time.cp_overlap, time.dp_overlap)
                     : fmt::format("tp + pp + (1 − {:.2f})·dp (no overlap but the stated one)",
                                   time.dp_overlap),
       plan.exposed_comm_s, "s");
  term("step time", "(compute + attention-score traffic) / (1 − bubble) + exposed comm",
       plan.step_s, "s");
  term("tokens/s", "tokens per step / step time", plan.tokens_per_s, "tokens/s");
  term("MFU", "model FLOPs · tokens / (step time · devices · peak)", plan.mfu, "");
  return plan;
}

}  // namespace meshtrain::plan
