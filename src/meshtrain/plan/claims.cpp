#include "meshtrain/plan/claims.h"

#include <fmt/format.h>

#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/plan/accounting.h"
#include "meshtrain/plan/formulas.h"

namespace meshtrain::plan {
namespace {

double f(std::int64_t v) { return static_cast<double>(v); }

void check_inputs(std::int64_t seq, std::int64_t devices, const ThroughputClaim& claim) {
  std::vector<ConfigIssue> issues;
  const bool samples = claim.samples_per_s != 0.0, tokens = claim.tokens_per_s != 0.0;
  for (const auto& [name, value, given] :
       {std::tuple{"--claim-samples-per-s", claim.samples_per_s, samples},
        std::tuple{"--claim-tokens-per-s", claim.tokens_per_s, tokens}}) {
    if (given && !(std::isfinite(value) && value > 0.0)) {
      issues.push_back({name, fmt::format("{}", value), "must be a finite number > 0",
                        "give the throughput the claim states, e.g. 182"});
    }
  }
  if (samples && tokens) {
    issues.push_back({"--claim-samples-per-s / --claim-tokens-per-s", "both given",
                      "give one: tokens/s = samples/s × --seq",
                      "keep --claim-samples-per-s (sequences per second) or --claim-tokens-per-s"});
  }
  if (!samples && !tokens) {
    issues.push_back({"--claim-samples-per-s / --claim-tokens-per-s", "neither given",
                      "a claim check needs the claimed throughput", "give one of them"});
  }
  if (seq < 1) {
    issues.push_back({"--seq", fmt::format("{}", seq), "must be ≥ 1", "use e.g. 2048"});
  }
  if (devices < 1) {
    issues.push_back({"devices", fmt::format("{}", devices), "must be ≥ 1", "use --nodes"});
  }
  if (!issues.empty()) throw ConfigError("throughput claim", std::move(issues));
}

}  // namespace

ClaimCheck check_claim(const ModelConfig& model, std::int64_t seq, std::int64_t devices,
                       const ClusterSpec& cluster, Precision precision,
                       const ThroughputClaim& claim) {
  check_inputs(seq, devices, claim);
  ClaimCheck c;
  c.seq = seq;
  c.devices = devices;
  c.tokens_per_s = claim.tokens_per_s > 0.0 ? claim.tokens_per_s : claim.samples_per_s * f(seq);
  c.samples_per_s = c.tokens_per_s / f(seq);
  const ModelSize size = model_size(model);
  c.flops_per_token = model_flops_per_token(size.matmul_parameters, model.n_layer, model.n_embd, seq);
  c.claimed_flops = c.tokens_per_s * c.flops_per_token;
  c.peak_flops = f(devices) * peak_flops_for(cluster, to_string(precision));
  c.implied_mfu = c.claimed_flops / c.peak_flops;
  c.exceeds_peak = c.implied_mfu > 1.0;
  // FLOP/s(s) = rate(s) · (6Ψ + a·s), a = 12·L·h; rate = samples/s · s, or tokens/s fixed.
  const double six_psi = 6.0 * size.matmul_parameters;
  const double a = 12.0 * f(model.n_layer) * f(model.n_embd), peak = c.peak_flops;
  double s_max = 0.0;
  if (claim.tokens_per_s > 0.0) {
    s_max = (peak / claim.tokens_per_s - six_psi) / a;
  } else {
    // S·a·s² + S·6Ψ·s − peak = 0, its positive root.
    const double A = c.samples_per_s * a, B = c.samples_per_s * six_psi;
    s_max = (-B + std::sqrt(B * B + 4.0 * A * peak)) / (2.0 * A);
  }
  c.max_seq_at_peak = s_max >= 1.0 ? s_max : 0.0;
  return c;
}

std::string format_claim(const ClaimCheck& c, const std::string& model_name) {
  std::string out = fmt::format(
      "Throughput claim: {:.6g} samples/s × {} tokens = {:.6g} tokens/s of {} on {} devices\n"
      "  model FLOPs per token 6·Ψ_mm + 12·L·h·s = {:.4g} (Ψ_mm: the active matrix-product "
      "parameters)\n"
      "  implied {:.4g} FLOP/s against the devices' peak {:.4g} FLOP/s: MFU {:.1f} %\n",
      c.samples_per_s, c.seq, c.tokens_per_s, model_name, c.devices, c.flops_per_token,
      c.claimed_flops, c.peak_flops, 100.0 * c.implied_mfu);
  if (c.exceeds_peak) {
    out += fmt::format(
        "  IMPOSSIBLE: the claim needs {:.2f}× the peak FLOP/s of the devices (MFU > 100 %)",
        c.implied_mfu);
  } else {
    out += fmt::format("  possible: within the peak ({:.1f} % of it; published large runs reach "
                       "about 40–55 %)",
                       100.0 * c.implied_mfu);
  }
  out += c.max_seq_at_peak >= 1.0
             ? fmt::format("; it reaches the peak at s ≈ {:.0f} tokens\n", c.max_seq_at_peak)
             : "; it exceeds the peak at every sequence length\n";
  return out;
}

}  // namespace meshtrain::plan
