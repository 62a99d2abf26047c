// src/meshtrain/plan/claims.h
//
// A published throughput checked against the hardware (docs/planner.md, "Throughput claims"):
// a claimed samples/s or tokens/s of a model at sequence length s on n devices implies
// model FLOP/s = tokens/s × (6·Ψ_mm + 12·L·h·s) (formulas.h's model_flops_per_token, with the
// ACTIVE matmul parameters of a MoE model), and an MFU = that ÷ (n × the devices' peak under
// the precision: 312 TFLOP/s for an A100 in bf16). An MFU above 1 cannot be: the claim says
// the devices ran faster than their peak (Megatron-LM's and PaLM's MFU vocabulary: Narayanan
// et al. 2021, §5.1; Chowdhery et al. 2022, App. B). Uses: plan/accounting, plan/cluster.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/config/config.h"
#include "meshtrain/plan/cluster.h"

namespace meshtrain::plan {

/// What was claimed: exactly one of the two > 0.
struct ThroughputClaim {
  double samples_per_s = 0.0;  // sequences per second
  double tokens_per_s = 0.0;
};

struct ClaimCheck {
  std::int64_t seq = 0;
  std::int64_t devices = 0;
  double samples_per_s = 0.0;
  double tokens_per_s = 0.0;
  double flops_per_token = 0.0;  // 6·Ψ_mm(active) + 12·L·h·s
  double claimed_flops = 0.0;    // FLOP/s the claim implies
  double peak_flops = 0.0;       // devices × peak per device
  double implied_mfu = 0.0;      // claimed / peak
  bool exceeds_peak = false;     // implied_mfu > 1: impossible
  // The longest sequence at which the claim would still be ≤ the peak (the attention term grows
  // with s; a samples/s claim also carries s tokens per sample): 0 when none, even s = 1.
  double max_seq_at_peak = 0.0;
};

/// The check of `claim` for `model` at sequence length `seq` on `devices` devices of `cluster`
/// under `precision`. Throws ConfigError when the claim is not exactly one positive finite
/// number, or seq / devices < 1.
ClaimCheck check_claim(const ModelConfig& model, std::int64_t seq, std::int64_t devices,
                       const ClusterSpec& cluster, Precision precision,
                       const ThroughputClaim& claim);

/// "claimed 182 samples/s × 512 tokens = 93,184 tokens/s on 32 devices: ... implies MFU 393 %
/// — exceeds the peak 3.9×: impossible" — a few lines.
std::string format_claim(const ClaimCheck& check, const std::string& model_name);

}  // namespace meshtrain::plan
