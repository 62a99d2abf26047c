#include "meshtrain/plan/context_parallel.h"

#include <fmt/format.h>

#include "meshtrain/config/validate.h"
#include "meshtrain/plan/formulas.h"

namespace meshtrain::plan {
namespace {

double f(std::int64_t v) { return static_cast<double>(v); }

bool ring(const Config& c) { return c.parallel.cp_comm != CpCommMode::a2a; }

// The width of k (and of v) on one tp rank: kv heads × head size / tp.
double kv_local(const Config& c) {
  const ModelConfig& m = c.model;
  return f(kv_heads_of(m)) * f(m.n_embd) / f(m.n_head) / f(c.parallel.tp);
}

// K and V of the local tokens, fp32: the block a ring step passes on.
double kv_block_bytes(const Config& c) { return 2.0 * local_tokens(c) * kv_local(c) * 4.0; }

double sum_bytes(const std::vector<CpMessage>& messages) {
  double out = 0.0;
  for (const CpMessage& msg : messages) out += msg.count * msg.bytes;
  return out;
}

}  // namespace

double local_tokens(const Config& c) {
  return f(c.training.micro_batch) * f(c.model.block_size) /
         f(std::max<std::int64_t>(1, c.parallel.cp));
}

std::int64_t reduction_group_size(const Config& c) {
  return std::max<std::int64_t>(1, c.parallel.dp) * std::max<std::int64_t>(1, c.parallel.cp);
}

CpLayerTraffic cp_layer_traffic(const Config& c) {
  CpLayerTraffic t;
  const double cp = f(c.parallel.cp);
  if (c.parallel.cp <= 1) return t;
  const bool recomputed = c.training.recompute != RecomputeMode::none;
  if (ring(c)) {
    const double K = kv_block_bytes(c);
    t.forward = {{"K,V", cp - 1.0, K}};
    t.backward = {{"K,V", cp - 1.0, K}, {"dK,dV (last hop home)", cp, K}};
    if (recomputed) {
      t.backward.push_back({"K,V (recomputed forward)", cp - 1.0, K});
    }
    return t;
  }
  const double n = local_tokens(c), q = n * f(c.model.n_embd) / f(c.parallel.tp) * 4.0;
  const double kv = n * kv_local(c) * 4.0;
  t.forward = {{"q", 1.0, q}, {"k", 1.0, kv}, {"v", 1.0, kv}, {"out", 1.0, q}};
  t.backward = {{"d out", 1.0, q}, {"dq", 1.0, q}, {"dk", 1.0, kv}, {"dv", 1.0, kv}};
  // Selective recompute drops the core's head-sharded state too, so both recomputes repeat
  // the forward all-to-alls (transformer/attention.cpp).
  if (recomputed) {
    for (const CpMessage& msg : t.forward) {
      t.backward.push_back({msg.what + " (recomputed forward)", msg.count, msg.bytes});
    }
  }
  return t;
}

double cp_bytes_per_step(const Config& c, const ParameterCounts& sp) {
  if (c.parallel.cp <= 1) return 0.0;
  const CpLayerTraffic t = cp_layer_traffic(c);
  return f(c.training.accumulation) * f(sp.layers) * (sum_bytes(t.forward) + sum_bytes(t.backward));
}

double cp_time_per_step(const Config& c, const ParameterCounts& sp, const Link& link,
                        const TimeSettings& time) {
  if (c.parallel.cp <= 1) return 0.0;
  const CpLayerTraffic t = cp_layer_traffic(c);
  const double B = link.bandwidth_bytes_per_s, a = link.latency_s;
  const double wire = time.activation_wire_bytes / 4.0;  // the counted bytes are fp32
  double per_layer = 0.0;
  for (const auto* messages : {&t.forward, &t.backward}) {
    for (const CpMessage& msg : *messages) {
      const double one = ring(c) ? p2p_s(wire * msg.bytes, B, a)
                                 : all_to_all_s(wire * msg.bytes, c.parallel.cp, B, a);
      per_layer += msg.count * one;
    }
  }
  return f(c.training.accumulation) * f(sp.layers) * per_layer;
}

double cp_comm_buffer_bytes(const Config& c) {
  if (c.parallel.cp <= 1) return 0.0;
  // Ring backward: the K,V block double-buffered, and three dK,dV blocks — this step's sum,
  // the partial sum arriving from the previous rank, the one in flight to the next
  // (parallel/cp/context_attention.cpp).
  if (ring(c)) return 5.0 * kv_block_bytes(c);
  // Ulysses: one layer's q, k, v in the other sharding, as the all-to-all's send and receive
  // buffers.
  const double width = f(c.model.n_embd) / f(c.parallel.tp) + 2.0 * kv_local(c);
  return 2.0 * 4.0 * local_tokens(c) * width;
}

std::string cp_time_formula(const Config& c) {
  if (ring(c)) {
    return fmt::format(
        "m·L·[(cp−1) fwd + (cp−1){} K,V + cp dK,dV bwd] p2p of K = 2·b·(s/cp)·(kv/t)·4 B: D/B + α "
        "each",
        c.training.recompute == RecomputeMode::none ? "" : " + (cp−1) recompute");
  }
  return fmt::format(
      "m·L·{} all-to-alls (q, k, v, out; bwd d out, dq, dk, dv{}) of b·(s/cp)·(h|kv)/t·4 B: "
      "(cp−1)/cp·D/B + (cp−1)α each",
      c.training.recompute == RecomputeMode::full ? 12 : 8,
      c.training.recompute == RecomputeMode::full ? "; the forward's again" : "");
}

}  // namespace meshtrain::plan
