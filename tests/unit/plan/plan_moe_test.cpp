// Mixture of experts in the planner (plan/moe.h, plan/claims.h): total and active parameters
// hand-counted for a small config and for Mixtral-8x7B, expert memory per rank for ep 1/2/4,
// the ep all-to-all bytes and time, the seed 000 Mixtral row (32 ranks on 64 GPUs, ep 8 ∤ dp 4)
// with its nearest valid layouts, and the throughput claims of seed 000's table.
// docs/planner.md, "Mixture of experts" and "Throughput claims".
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/claims.h"
#include "meshtrain/plan/formulas.h"
#include "meshtrain/plan/moe.h"
#include "meshtrain/plan/nearest.h"
#include "meshtrain/plan/presets.h"
#include "meshtrain/plan/published_runs.h"

namespace meshtrain::plan {
namespace {

// 4 blocks, C = 32, 4 heads (2 kv: k, v 16 wide), F = 64, V = 65; E = 4 experts of F_moe = 48,
// top-2, blocks 0 and 2 MoE (freq 2).
ModelConfig small_moe() {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.n_layer = 4;
  m.n_embd = 32;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.ffn_hidden = 64;
  m.vocab_size = 65;
  m.block_size = 16;
  m.bias = false;
  m.moe_experts = 4;
  m.moe_top_k = 2;
  m.moe_ffn_hidden = 48;
  m.moe_layer_freq = 2;
  return m;
}

Config small_config(std::int64_t tp, std::int64_t dp, std::int64_t ep, std::int64_t zero = 1) {
  Config c;
  c.model = small_moe();
  c.parallel.tp = tp;
  c.parallel.dp = dp;
  c.parallel.ep = ep;
  c.parallel.zero_stage = zero;
  c.training.micro_batch = 2;
  c.training.accumulation = 3;
  c.training.precision = Precision::fp32;
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(PlanMoe, SmallConfigTotalAndActiveParametersByHand) {
  const ModelConfig m = small_moe();
  EXPECT_TRUE(is_moe_layer(m, 0));
  EXPECT_FALSE(is_moe_layer(m, 1));
  EXPECT_TRUE(is_moe_layer(m, 2));
  EXPECT_EQ(moe_layers_in(m, 0, 4), 2);
  EXPECT_EQ(expert_elements(m), 3.0 * 32 * 48);  // 4608
  // Attention 2·32·32 + 2·16·32 = 3072; norms 64; dense MLP 3·32·64 = 6144; router 4·32 = 128.
  // Dense block 9280, MoE block 3072 + 64 + 128 + 4·4608 = 21696; embeddings, head 65·32 each,
  // final norm 32: 2·9280 + 2·21696 + 2·2080 + 32 = 66144.
  const ModelSize s = model_size(m);
  EXPECT_EQ(s.parameters, 66144.0);
  EXPECT_EQ(s.expert_parameters, 2.0 * 4 * 4608);
  // Active: 2 of 4 experts per MoE block: 66144 − 2·2·4608 = 47712.
  EXPECT_EQ(s.active_parameters, 47712.0);
  // Matmul (active): dense 2·(3072 + 6144), MoE 2·(3072 + 128 + 2·4608), head 2080 = 45344.
  EXPECT_EQ(s.matmul_parameters, 45344.0);
  // A dense model has active = total.
  ModelConfig dense = m;
  dense.moe_experts = 0;
  EXPECT_EQ(model_size(dense).active_parameters, model_size(dense).parameters);
}

TEST(PlanMoe, MixtralTotalAndActiveParameters) {
  const ModelPreset p = model_from("mixtral-8x7b");
  const ModelSize s = model_size(p.model);
  // Per block: attention 2·4096² + 2·1024·4096 = 41,943,040; 8 experts × 3·4096·14336 =
  // 8 × 176,160,768; router 32,768; norms 8192. × 32 + 2·32000·4096 + 4096.
  EXPECT_EQ(s.parameters, 46702792704.0);
  EXPECT_EQ(s.active_parameters, 12879925248.0);
  // Jiang et al. 2024: 46.7B total ("47B"), 12.9B active ("13B").
  EXPECT_NEAR(s.parameters / 46.7e9, 1.0, 0.01);
  EXPECT_NEAR(s.active_parameters / 12.9e9, 1.0, 0.01);
  EXPECT_EQ(s.matmul_parameters, 12748587008.0);
}

TEST(PlanMoe, ExpertMemoryPerRankForEpOneTwoFour) {
  // tp 2, dp 4, pp 1, fp32, ZeRO-1. Dense per rank: dense blocks (1536 + 3072 + 64) × 2, MoE
  // blocks' attention, norms and router (1536 + 64 + 128) × 2, vocab shard ⌈65/2⌉·32 = 1056
  // twice, final norm 32: 14944. Experts: 2 MoE blocks × (4/ep) × 4608, whole on each tp rank.
  const double dense = 14944.0;
  for (const std::int64_t ep : {1, 2, 4}) {
    const Config c = small_config(2, 4, ep);
    ASSERT_TRUE(check_config(c, 8).empty()) << ep;
    const ParameterCounts sp = stage_parameters(c, 0);
    const double experts = 2.0 * static_cast<double>(4 / ep) * 4608.0;
    EXPECT_EQ(sp.experts, experts) << ep;
    EXPECT_EQ(sp.total, dense + experts) << ep;
    EXPECT_EQ(expert_group_size(c), 4 / ep);
    const MemoryBreakdown mem = model_state_bytes_moe(c, sp);
    EXPECT_EQ(mem.params, 4.0 * (dense + experts)) << ep;
    EXPECT_EQ(mem.grads, 4.0 * (dense + experts)) << ep;
    // Adam m, v sliced: dense over dp = 4, experts over (dp·cp)/ep: 8·Ψ_e·ep/4 — the same for
    // every ep (E/ep experts over dp/ep ranks), 2·14944 + 8·36864/4 = 103616.
    EXPECT_EQ(mem.optimizer, 2.0 * dense + 8.0 * experts / static_cast<double>(4 / ep)) << ep;
    EXPECT_EQ(mem.optimizer, 103616.0) << ep;
  }
}

TEST(PlanMoe, ExpertGradientsReduceOverTheExpertGroup) {
  // ZeRO-0, dp 4: dense 4Ψ_d + 8 (the scalars); experts 4Ψ_e over dp/ep ranks, nothing at ep 4.
  const Config ep1 = small_config(2, 4, 1, 0), ep4 = small_config(2, 4, 4, 0);
  const ParameterCounts s1 = stage_parameters(ep1, 0), s4 = stage_parameters(ep4, 0);
  EXPECT_EQ(dp_bytes_per_step_moe(ep1, s1), 4.0 * (14944.0 + 36864.0) + 8.0);
  EXPECT_EQ(dp_bytes_per_step_moe(ep4, s4), 4.0 * 14944.0 + 8.0);  // one rank per expert
}

TEST(PlanMoe, AllToAllBytesAndTimeByHand) {
  // b = 2, s = 16: N = 32 tokens, k = 2 → 64 rows of C = 32; ep 2 of dp 2; m = 3; 2 MoE blocks.
  Config c = small_config(2, 2, 2);
  c.model.block_size = 16;
  ASSERT_TRUE(check_config(c, 4).empty());
  const EpLayerTraffic t = ep_layer_traffic(c);
  EXPECT_EQ(t.tokens, 32.0);
  EXPECT_EQ(t.rows_sent, 64.0);
  EXPECT_EQ(t.rows_leaving, 32.0);  // (ep−1)/ep of them
  EXPECT_EQ(t.counts_bytes, 16.0);  // 4·E
  EXPECT_EQ(t.dispatch_bytes, 8192.0);
  EXPECT_EQ(t.combine_bytes, 8192.0);
  EXPECT_EQ(t.rows_received_bound, 2.0 * 64.0);  // dropless: ep·N·k
  const ParameterCounts sp = stage_parameters(c, 0);
  EXPECT_EQ(sp.moe_layers, 2);
  // m·L_moe·(forward 16 + 8192 + 8192 + backward 8192 + 8192) = 3·2·32784.
  EXPECT_EQ(ep_bytes_per_step(c, sp), 196704.0);
  // Time at 1 GB/s, no latency: (ep−1)/ep of each op's input, 0.5·32784 B per block and mb.
  EXPECT_NEAR(ep_time_per_step(c, sp, {.bandwidth_bytes_per_s = 1e9, .latency_s = 0.0}),
              6.0 * 0.5 * 32784.0 / 1e9, 1e-15);
  // Full recompute runs the forward exchange again: 3·2·(2·16400 + 16384).
  Config full = c;
  full.training.recompute = RecomputeMode::full;
  EXPECT_EQ(ep_bytes_per_step(full, sp), 295104.0);
  // Sequence parallelism: each tp rank routes its N/tp tokens.
  Config sp_on = c;
  sp_on.parallel.sequence_parallel = true;
  EXPECT_EQ(ep_bytes_per_step(sp_on, sp), 3.0 * 2.0 * (16.0 + 2.0 * 4096.0 + 2.0 * 4096.0));
  // Capacity 1.25: every rank keeps ≤ ⌈32·2/4·1.25⌉ = 20 rows per expert: ≤ 80 received.
  Config cap = c;
  cap.model.moe_capacity_factor = 1.25;
  EXPECT_EQ(ep_layer_traffic(cap).rows_received_bound, 80.0);
  // ep = 1 has no exchange; the plan's ep axis carries the same bytes.
  EXPECT_EQ(ep_bytes_per_step(small_config(2, 2, 1), sp), 0.0);
  const Plan p = account(c.model, {.tp = 2, .dp = 2, .ep = 2, .micro_batch = 2, .accumulation = 3},
                         {.seq = 16, .global_batch = 12, .precision = Precision::fp32},
                         cluster_from("cpu-this-machine"));
  bool found = false;
  for (const AxisComm& a : p.comm) {
    if (a.axis != Axis::ep) continue;
    found = true;
    EXPECT_EQ(a.size, 2);
    EXPECT_EQ(a.bytes_per_step, 196704.0);
  }
  EXPECT_TRUE(found);
}

TEST(PlanMoe, SeedMixtralRowBreaksTheWorldAndEpAndGetsValidLayouts) {
  const SeedLayoutRow& row = seed000_row("Mixtral-8x7B");
  const Layout printed = seed_layout(row);
  EXPECT_EQ(printed.devices(), 32);  // tp 4 · pp 2 · dp 4, not the 64 GPUs
  const ClusterSpec cluster = seed_cluster(row);
  ASSERT_EQ(cluster.devices(), 64);
  const ModelConfig model = seed_model(row);
  EXPECT_EQ(model.moe_capacity_factor, 1.8);
  const LayoutDiagnosis d = diagnose_layout(model, printed, seed_settings(row), cluster, {}, 1, 6,
                                            {.size = 1, .comm = CpCommMode::p2p});
  const std::string text = format_diagnosis(d, printed, cluster);
  ASSERT_EQ(d.issues.size(), 2u) << text;
  EXPECT_EQ(d.issues[0].setting, "parallel.ep") << text;  // ep 8 ∤ dp 4
  EXPECT_NE(text.find("parallel.dp = 4 must be divisible by parallel.ep"), std::string::npos)
      << text;
  EXPECT_NE(text.find("4 × 2 × 4 × 1 = 32"), std::string::npos) << text;
  EXPECT_NE(text.find("64 devices"), std::string::npos) << text;
  ASSERT_FALSE(d.proposals.empty()) << text;
  for (std::size_t i = 0; i < d.proposals.size(); ++i) {
    const Layout& l = d.proposals[i].layout;
    EXPECT_EQ(l.devices(), 64) << to_string(l);
    EXPECT_EQ(l.dp % l.ep, 0) << to_string(l);
    EXPECT_EQ(8 % l.ep, 0) << to_string(l);
    EXPECT_TRUE(d.proposals[i].fits) << to_string(l);
    if (i > 0) {
      EXPECT_LE(d.changed[i - 1], d.changed[i]);
    }
  }
  // The nearest keeps tp 4 · pp 2 · ep 8 and doubles dp: one factor changed.
  EXPECT_EQ(d.changed.front(), 1) << text;
  EXPECT_EQ(d.proposals.front().layout.dp, 8) << text;
  EXPECT_EQ(d.proposals.front().layout.ep, 8) << text;
}

TEST(PlanMoe, MixtralPlanChargesExpertsAndAllToAll) {
  const ModelConfig model = seed_model(seed000_row("Mixtral-8x7B"));
  const Layout l{.tp = 4, .pp = 2, .dp = 8, .ep = 8, .zero_stage = 1, .micro_batch = 1,
                 .accumulation = 128, .recompute = RecomputeMode::selective};
  const TrainingSettings s{.seq = 2048, .global_batch = 1024, .precision = Precision::bf16};
  ASSERT_TRUE(check_layout(model, l, s).empty());
  ClusterSpec cluster = cluster_from("8xA100-80GB");
  cluster.nodes = 8;
  const Plan p = account(model, l, s, cluster);
  const ParameterCounts sp = stage_parameters(p.config, 0);
  EXPECT_EQ(sp.moe_layers, 16);
  EXPECT_EQ(sp.experts, 16.0 * 176160768.0);  // one expert per MoE block, whole on each tp rank
  // Experts' state is not sliced (dp/ep = 1 rank per expert): 2 + 4 + 12 B per element in bf16.
  EXPECT_EQ(expert_group_size(p.config), 1);
  EXPECT_GT(p.peak.optimizer, 12.0 * sp.experts);
  // The MFU counts the active parameters: compute = 6·Ψ_active_mm + attention.
  const double flops = model_flops_per_token(12748587008.0, 32, 4096, 2048);
  EXPECT_NEAR(p.mfu, flops * 1024.0 * 2048.0 / (p.step_s * 64.0 * 312e12), 1e-12);
}

// Hand-derived (docs/planner.md, "Throughput claims"): FLOPs per token 6·Ψ_mm + 12·L·h·s,
// implied MFU = samples/s · s · that / (GPUs · 312e12).
TEST(PlanClaims, SeedTableRowsImplyMfuAbovePeak) {
  struct Expect {
    const char* row;
    double flops_per_token, mfu, max_seq;
  };
  const Expect expected[] = {
      {"Llama-3-8B", 4.82492e10, 25.9704, 84.0},
      {"Llama-3-70B", 4.33116e11, 16.1697, 131.0},
      {"Mixtral-8x7B", 7.97127e10, 1.1855, 1738.0},
      {"LongChat-32B", 3.50926e11, 205.0125, 287.0},
  };
  const ClusterSpec a100 = cluster_from("8xA100-80GB");
  for (const Expect& e : expected) {
    const SeedLayoutRow& row = seed000_row(e.row);
    const ClaimCheck c = check_claim(seed_model(row), row.seq, row.gpus, a100, Precision::bf16,
                                     {.samples_per_s = row.samples_per_s});
    EXPECT_NEAR(c.flops_per_token / e.flops_per_token, 1.0, 1e-5) << e.row;
    EXPECT_NEAR(c.implied_mfu / e.mfu, 1.0, 1e-4) << e.row;
    EXPECT_TRUE(c.exceeds_peak) << e.row;
    EXPECT_NEAR(c.max_seq_at_peak, e.max_seq, 1.0) << e.row;
    EXPECT_NE(format_claim(c, e.row).find("IMPOSSIBLE"), std::string::npos);
  }
  // The issue's figure: Llama-3-70B at 182 samples/s is ≈ 3.93× the peak even at s = 512.
  const SeedLayoutRow& r70 = seed000_row("Llama-3-70B");
  const ClaimCheck at512 = check_claim(seed_model(r70), 512, 32, a100, Precision::bf16,
                                       {.samples_per_s = 182.0});
  EXPECT_NEAR(at512.implied_mfu, 3.9297, 1e-3);
  EXPECT_NEAR(at512.tokens_per_s, 93184.0, 1e-9);
  // Mixtral: on the 32 ranks its layout has, twice that; at s = 512 on 64 GPUs it is possible.
  const ModelConfig mixtral = seed_model(seed000_row("Mixtral-8x7B"));
  EXPECT_NEAR(check_claim(mixtral, 2048, 32, a100, Precision::bf16, {.samples_per_s = 145.0})
                  .implied_mfu,
              2.3709, 1e-3);
  const ClaimCheck short_seq =
      check_claim(mixtral, 512, 64, a100, Precision::bf16, {.samples_per_s = 145.0});
  EXPECT_FALSE(short_seq.exceeds_peak);
  EXPECT_NEAR(short_seq.implied_mfu, 0.2874, 1e-3);
  EXPECT_NE(format_claim(short_seq, "mixtral").find("possible"), std::string::npos);
}

TEST(PlanClaims, TokensClaimAndThePlansOwnThroughputAgree) {
  // A claim of exactly the planner's predicted tokens/s implies the planner's MFU.
  const ModelConfig model = model_from("llama3-8b").model;
  const Layout l{.tp = 2, .dp = 2, .micro_batch = 8, .accumulation = 1,
                 .recompute = RecomputeMode::selective};
  const TrainingSettings s{.seq = 2048, .global_batch = 16, .precision = Precision::bf16};
  ClusterSpec cluster = cluster_from("8xA100-80GB");
  cluster.devices_per_node = 4;
  const Plan p = account(model, l, s, cluster);
  const ClaimCheck c = check_claim(model, 2048, 4, cluster, Precision::bf16,
                                   {.tokens_per_s = p.tokens_per_s});
  EXPECT_NEAR(c.implied_mfu, p.mfu, 1e-12);
  EXPECT_FALSE(c.exceeds_peak);
  EXPECT_NEAR(c.samples_per_s, p.tokens_per_s / 2048.0, 1e-9);
}

TEST(PlanClaims, BadClaimsAreConfigErrors) {
  const ModelConfig m = model_from("llama3-8b").model;
  const ClusterSpec a100 = cluster_from("8xA100-80GB");
  auto check = [&](ThroughputClaim claim, std::int64_t seq = 2048) {
    return error_of([&] { check_claim(m, seq, 8, a100, Precision::bf16, claim); });
  };
  EXPECT_NE(check({}).find("neither given"), std::string::npos);
  EXPECT_NE(check({.samples_per_s = 1.0, .tokens_per_s = 2.0}).find("both given"),
            std::string::npos);
  EXPECT_NE(check({.samples_per_s = -3.0}).find("--claim-samples-per-s = -3"), std::string::npos);
  EXPECT_NE(check({.tokens_per_s = std::numeric_limits<double>::quiet_NaN()})
                .find("must be a finite number > 0"),
            std::string::npos);
  EXPECT_NE(check({.samples_per_s = 1.0}, 0).find("--seq"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain::plan
