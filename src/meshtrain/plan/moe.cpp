#include "meshtrain/plan/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/config/validate.h"
#include "meshtrain/plan/context_parallel.h"
#include "meshtrain/plan/formulas.h"

namespace meshtrain::plan {
namespace {

double f(std::int64_t v) { return static_cast<double>(v); }

}  // namespace

bool is_moe(const ModelConfig& m) { return m.moe_experts > 0; }

bool is_moe_layer(const ModelConfig& m, std::int64_t layer) {
  return is_moe(m) && layer % std::max<std::int64_t>(m.moe_layer_freq, 1) == 0;
}

std::int64_t moe_layers_in(const ModelConfig& m, std::int64_t first, std::int64_t count) {
  std::int64_t n = 0;
  for (std::int64_t i = first; i < first + count; ++i) n += is_moe_layer(m, i) ? 1 : 0;
  return n;
}

double expert_elements(const ModelConfig& m) { return 3.0 * f(m.n_embd) * f(moe_ffn_hidden_of(m)); }

std::int64_t expert_group_size(const Config& c) {
  return reduction_group_size(c) / std::max<std::int64_t>(c.parallel.ep, 1);
}

ParameterCounts dense_part(const ParameterCounts& sp) {
  ParameterCounts d = sp;
  d.total = sp.total - sp.experts;
  d.largest_unit = sp.largest_dense_unit;
  d.experts = d.largest_expert_unit = 0.0;
  return d;
}

ParameterCounts expert_part(const ParameterCounts& sp) {
  ParameterCounts e;
  e.total = e.experts = sp.experts;
  e.largest_unit = e.largest_expert_unit = sp.largest_expert_unit;
  e.layers = sp.moe_layers;  // the hook units that hold experts
  e.moe_layers = sp.moe_layers;
  return e;
}

Config expert_group_config(const Config& c) {
  Config e = c;
  const std::int64_t ep = std::max<std::int64_t>(c.parallel.ep, 1);
  e.parallel.dp = std::max<std::int64_t>(c.parallel.dp / ep, 1);
  e.parallel.ep = 1;
  return e;
}

MemoryBreakdown model_state_bytes_moe(const Config& c, const ParameterCounts& sp) {
  MemoryBreakdown out = model_state_bytes(c, sp.total - sp.experts);
  if (sp.experts <= 0.0) return out;
  const MemoryBreakdown e = model_state_bytes(expert_group_config(c), sp.experts);
  out.params += e.params;
  out.grads += e.grads;
  out.optimizer += e.optimizer;
  return out;
}

double dp_bytes_per_step_moe(const Config& c, const ParameterCounts& sp) {
  const double dense = dp_bytes_per_step(c, dense_part(sp));
  if (sp.experts <= 0.0) return dense;
  // The expert group's collectives; its scalar reductions (loss, grad norm) are the dense
  // group's, so the formula's value at Ψ = 0 is taken off.
  const Config ec = expert_group_config(c);
  const ParameterCounts e = expert_part(sp);
  ParameterCounts none = e;
  none.total = 0.0;
  return dense + dp_bytes_per_step(ec, e) - dp_bytes_per_step(ec, none);
}

double dp_time_per_step_moe(const Config& c, const ParameterCounts& sp, const Link& link,
                            const TimeSettings& time) {
  const double dense = dp_time_per_step(c, dense_part(sp), link, time);
  if (sp.experts <= 0.0) return dense;
  // The expert group spans the same nodes as the dp × cp group (every ep-th dp rank), so it
  // is charged on the same link.
  return dense + dp_time_per_step(expert_group_config(c),
                                  expert_part(sp), link, time);
}

double comm_buffer_bytes_moe(const Config& c, const ParameterCounts& sp) {
  const double dense = comm_buffer_bytes(c, dense_part(sp));
  if (sp.experts <= 0.0) return dense;
  return dense +
         dp_comm_buffer_bytes(expert_group_config(c), expert_part(sp));
}

EpLayerTraffic ep_layer_traffic(const Config& c) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  EpLayerTraffic t;
  if (!is_moe(m) || p.ep <= 1) return t;
  const double E = f(m.moe_experts), k = f(m.moe_top_k), C = f(m.n_embd), ep = f(p.ep);
  t.tokens = local_tokens(c) / (p.sequence_parallel ? f(p.tp) : 1.0);
  t.rows_sent = t.tokens * k;
  t.rows_leaving = t.rows_sent * (ep - 1.0) / ep;
  t.rows_received = t.rows_sent;
  t.rows_received_bound =
      m.moe_capacity_factor > 0.0
          ? E * std::ceil(t.tokens * k / E * m.moe_capacity_factor)
          : ep * t.rows_sent;
  t.counts_bytes = 4.0 * E;
  t.dispatch_bytes = 4.0 * C * t.rows_sent;
  t.combine_bytes = 4.0 * C * t.rows_received;
  return t;
}

namespace {

double forwards_per_micro_batch(const Config& c) {
  return c.training.recompute == RecomputeMode::full ? 2.0 : 1.0;
}

}  // namespace

double ep_bytes_per_step(const Config& c, const ParameterCounts& sp) {
  const EpLayerTraffic t = ep_layer_traffic(c);
  if (c.parallel.ep <= 1 || sp.moe_layers == 0) return 0.0;
  return f(c.training.accumulation) * f(sp.moe_layers) *
         (forwards_per_micro_batch(c) * t.forward_bytes() + t.backward_bytes());
}

double ep_time_per_step(const Config& c, const ParameterCounts& sp, const Link& link) {
  const std::int64_t n = c.parallel.ep;
  if (n <= 1 || sp.moe_layers == 0) return 0.0;
  const EpLayerTraffic t = ep_layer_traffic(c);
  const double B = link.bandwidth_bytes_per_s, a = link.latency_s;
  const double rows = all_to_all_s(t.dispatch_bytes, n, B, a) + all_to_all_s(t.combine_bytes, n, B, a);
  const double forward = all_to_all_s(t.counts_bytes, n, B, a) + rows;
  return f(c.training.accumulation) * f(sp.moe_layers) *
         (forwards_per_micro_batch(c) * forward + rows);
}

std::string ep_time_formula(const Config& c) {
  return fmt::format(
      "m·L_moe·({}·[a2a(4E) + a2a(4C·Nk) + a2a(4C·Nk)] + a2a(4C·Nk) + a2a(4C·Nk)), N = b·s{}{} "
      "tokens, k = {}, uniform routing; a2a(D) = (ep−1)/ep·D/B + (ep−1)α",
      forwards_per_micro_batch(c) > 1.0 ? "2 (full recompute)" : "1", c.parallel.cp > 1 ? "/cp" : "",
      c.parallel.sequence_parallel ? "/tp" : "", c.model.moe_top_k);
}

}  // namespace meshtrain::plan
