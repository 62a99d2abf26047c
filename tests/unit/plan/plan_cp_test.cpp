// Context parallel in the planner (plan/context_parallel.h, plan/nearest.h): the cp formulas
// against hand-computed numbers on the main job (configs/shakespeare_char.toml: 4 blocks,
// h = 128, 4 heads, s = 64, b = 12) and its Llama twin (2 kv heads), the cp rules, cp in the
// search and the placement, and seed 000's LongChat-32B row (tp 2 · pp 2 · dp 4 · cp 4 = 64
// ranks on 16 A100s) diagnosed with its nearest valid layouts. docs/planner.md, "Context
// parallel".
#include <gtest/gtest.h>

#include <algorithm>

#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/plan/context_parallel.h"
#include "meshtrain/plan/nearest.h"
#include "meshtrain/plan/presets.h"
#include "meshtrain/plan/published_runs.h"
#include "meshtrain/plan/search.h"

namespace meshtrain::plan {
namespace {

Config job(const std::string& file, std::int64_t cp, CpCommMode comm = CpCommMode::p2p) {
  Config c = load_config_file(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/" + file);
  c.model.vocab_size = 65;
  c.parallel.cp = cp;
  c.parallel.cp_comm = comm;
  c.training.precision = Precision::fp32;
  return c;
}
Config gpt2(std::int64_t cp, CpCommMode comm = CpCommMode::p2p) {
  return job("shakespeare_char.toml", cp, comm);
}
Config llama(std::int64_t cp, CpCommMode comm = CpCommMode::p2p) {
  return job("llama_shakespeare.toml", cp, comm);
}

double peak(const Config& c) { return activation_peak_bytes(c, stage_parameters(c, 0), 0); }

TEST(PlanCp, ActivationsPerRankAreDividedByCp) {
  // Every per-token activation (block input, norms, q, k, v, lse, attention output, MLP) is for
  // b·s/cp = 384 tokens at cp 2: half of docs/memory.md's measured 6,316,032 B per block and
  // 27,230,208 B peak — the peak of dp 2 at b 6 (13,615,104 B), which holds the same tokens.
  EXPECT_EQ(local_tokens(gpt2(2)), 384.0);
  EXPECT_EQ(activation_bytes_per_block(gpt2(2)), 6316032.0 / 2.0);
  EXPECT_EQ(peak(gpt2(2)), 13615104.0);
  EXPECT_EQ(peak(gpt2(4)), 27230208.0 / 4.0);
  for (const RecomputeMode recompute : {RecomputeMode::selective, RecomputeMode::full}) {
    Config one = gpt2(1), four = gpt2(4);
    one.training.recompute = four.training.recompute = recompute;
    EXPECT_EQ(peak(four), peak(one) / 4.0) << recompute;
  }
  // Ulysses also keeps the core's head-sharded q, k|v and output: (2h + 2kv)/t fp32 elements
  // per token and block, 4 blocks × 192 tokens × 512 × 4 B at cp 4; none under selective.
  EXPECT_EQ(peak(gpt2(4, CpCommMode::a2a)) - peak(gpt2(4)), 4.0 * 192.0 * 512.0 * 4.0);
  Config selective = gpt2(4, CpCommMode::a2a), ring = gpt2(4);
  selective.training.recompute = ring.training.recompute = RecomputeMode::selective;
  EXPECT_EQ(peak(selective), peak(ring));
  Config l = llama(2);
  EXPECT_EQ(peak(l), 25534464.0 / 2.0);
}

TEST(PlanCp, ZeroAndGradientsOverDpTimesCp) {
  // dp 1 × cp 2 reduces and shards like dp 2: the group is dp·cp.
  Config c = gpt2(2);
  const ParameterCounts p = stage_parameters(c, 0);
  EXPECT_EQ(reduction_group_size(c), 2);
  EXPECT_EQ(dp_bytes_per_step(c, p), 3216392.0);  // ZeRO-0: 4Ψ + 8, as at dp 2
  c.parallel.zero_stage = 1;
  EXPECT_EQ(dp_bytes_per_step(c, p), 4824592.0);                              // 4Ψ + 4Ψ/2 + 16
  EXPECT_EQ(model_state_bytes(c, 804096.0).optimizer, 8.0 * 804096.0 / 2.0);  // 8Ψ/N
  EXPECT_EQ(comm_buffer_bytes(c, p) - cp_comm_buffer_bytes(c), 4824576.0);    // dp 2's ZeRO-1
  c.parallel.dp = 2;
  c.parallel.zero_stage = 3;
  EXPECT_EQ(model_state_bytes(c, 804096.0).grads, 4.0 * 804096.0 / 4.0);  // N = 4
}

TEST(PlanCp, RingAttentionBytesAndTime) {
  // cp 2, gpt2: K = 2·(12·64/2)·128·4 = 393,216 B (K and V of the 384 local tokens). Per block
  // and micro-batch: forward (cp−1) = 1 block, backward (cp−1) + cp = 3; 4 blocks, m = 1.
  const Config c = gpt2(2);
  const ParameterCounts p = stage_parameters(c, 0);
  const CpLayerTraffic t = cp_layer_traffic(c);
  ASSERT_EQ(t.forward.size(), 1u);
  EXPECT_EQ(t.forward[0].count, 1.0);
  EXPECT_EQ(t.forward[0].bytes, 393216.0);
  EXPECT_EQ(cp_bytes_per_step(c, p), 4.0 * 4.0 * 393216.0);  // 6,291,456
  // cp 4: K = 196,608; forward 3, backward 3 + 4: 10 per block.
  EXPECT_EQ(cp_bytes_per_step(gpt2(4), p), 4.0 * 10.0 * 196608.0);
  // Recompute (selective or full) reruns the forward ring: + (cp−1) per block.
  Config sel = gpt2(2);
  sel.training.recompute = RecomputeMode::selective;
  EXPECT_EQ(cp_bytes_per_step(sel, p), 4.0 * 5.0 * 393216.0);
  // m = 3 micro-batches triple it; Llama's 2 kv heads halve K (kv = 64).
  Config m3 = gpt2(2);
  m3.training.accumulation = 3;
  EXPECT_EQ(cp_bytes_per_step(m3, p), 3.0 * 6291456.0);
  EXPECT_EQ(cp_bytes_per_step(llama(2), stage_parameters(llama(2), 0)), 16.0 * 196608.0);
  // Time: each block one message, D/B + α.
  const Link link{.bandwidth_bytes_per_s = 7.5e9, .latency_s = 13e-6};
  EXPECT_DOUBLE_EQ(cp_time_per_step(c, p, link), 16.0 * (393216.0 / 7.5e9 + 13e-6));
  // Backward's peak: 2 K,V blocks (double-buffered) + 3 dK,dV (this step's, the arriving
  // partial sum, the one in flight).
  EXPECT_EQ(cp_comm_buffer_bytes(c), 5.0 * 393216.0);
  EXPECT_EQ(cp_bytes_per_step(gpt2(1), p), 0.0);
  EXPECT_EQ(cp_comm_buffer_bytes(gpt2(1)), 0.0);
}

TEST(PlanCp, UlyssesAllToAllBytesAndTime) {
  // cp 2, gpt2: q = out = 384·128·4 = 196,608 B, k = v = 196,608 B (kv = h); forward 4 ops,
  // backward 4: 8 × 196,608 per block, 4 blocks.
  const Config c = gpt2(2, CpCommMode::a2a);
  const ParameterCounts p = stage_parameters(c, 0);
  EXPECT_EQ(cp_bytes_per_step(c, p), 4.0 * 8.0 * 196608.0);
  // Llama, 2 kv heads: k = v = 384·64·4 = 98,304; per block 2·(2·196,608 + 2·98,304).
  const Config l = llama(2, CpCommMode::a2a);
  EXPECT_EQ(cp_bytes_per_step(l, stage_parameters(l, 0)), 4.0 * 2.0 * 589824.0);
  // Both recomputes rerun the forward's four (selective drops the core's head-sharded state
  // with its output, transformer/attention.cpp).
  Config full = gpt2(2, CpCommMode::a2a), sel = gpt2(2, CpCommMode::a2a);
  full.training.recompute = RecomputeMode::full;
  sel.training.recompute = RecomputeMode::selective;
  EXPECT_EQ(cp_bytes_per_step(full, p), 4.0 * 12.0 * 196608.0);
  EXPECT_EQ(cp_bytes_per_step(sel, p), cp_bytes_per_step(full, p));
  // Time: 32 all-to-alls of 196,608 B over 2 ranks: (1/2)·D/B + α each.
  const Link link{.bandwidth_bytes_per_s = 7.5e9, .latency_s = 13e-6};
  EXPECT_DOUBLE_EQ(cp_time_per_step(c, p, link), 32.0 * (0.5 * 196608.0 / 7.5e9 + 13e-6));
  // One layer's q, k, v in the other sharding, send and receive: 2·4·384·(128 + 2·128).
  EXPECT_EQ(cp_comm_buffer_bytes(c), 2.0 * 4.0 * 384.0 * 384.0);
}

TEST(PlanCp, TpAndPpCarryTheLocalTokens) {
  Config c = gpt2(2);
  c.parallel.tp = 2;
  const double D = 384.0 * 128 * 4;  // (4L + 2) tensors of b·(s/cp)·h·4
  EXPECT_EQ(tp_bytes_per_step(c, stage_parameters(c, 0)), 18 * D + 12.0 * 384 + 8);
  Config pp = gpt2(2);
  pp.parallel.pp = 2;
  pp.training.accumulation = 4;
  EXPECT_EQ(pp_bytes_per_step(pp, stage_parameters(pp, 0)), 2 * 4 * D + 28);
}

TEST(PlanCp, RulesOfTheRuntimeDesign) {
  auto settings_of = [](const std::string& rule_setting, const std::vector<ConfigIssue>& issues) {
    return std::count_if(issues.begin(), issues.end(),
                         [&](const ConfigIssue& i) { return i.setting == rule_setting; });
  };
  const auto cp_rules = [](const Config& c) {
    return check_config(
        c, static_cast<int>(c.parallel.pp * c.parallel.dp * c.parallel.cp * c.parallel.tp));
  };
  EXPECT_TRUE(cp_rules(gpt2(1)).empty());
  EXPECT_TRUE(cp_rules(gpt2(4, CpCommMode::a2a)).empty());           // 64 % 8 == 0, 4 heads / 4
  EXPECT_EQ(settings_of("model.block_size", cp_rules(gpt2(3))), 1);  // 64 % 6 ≠ 0
  EXPECT_EQ(settings_of("model.n_head", cp_rules(gpt2(8, CpCommMode::a2a))), 1);  // 4 heads over 8
  EXPECT_TRUE(cp_rules(gpt2(8, CpCommMode::p2p)).empty());  // the ring needs none
  EXPECT_EQ(settings_of("model.n_kv_head", cp_rules(llama(4, CpCommMode::a2a))),
            1);  // 2 kv heads over 4
  // An unknown parallel.cp_comm is rejected when loaded (config_test, BadEnumNames...).
  // check_layout plans cp > 1 under the same rules.
  const ModelPreset main_job =
      model_from(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/shakespeare_char.toml");
  const TrainingSettings s{.seq = 64, .global_batch = 12, .precision = Precision::fp32};
  EXPECT_TRUE(check_layout(main_job.model, {.cp = 2, .accumulation = 12}, s).empty());
  EXPECT_FALSE(
      check_layout(main_job.model, {.cp = 8, .cp_comm = CpCommMode::a2a, .accumulation = 12}, s)
          .empty());
}

TEST(PlanCp, SearchedWhenAllowedAndPlacedBetweenTpAndDp) {
  const ModelPreset main_job =
      model_from(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/shakespeare_char.toml");
  const TrainingSettings s{.seq = 64, .global_batch = 16, .precision = Precision::fp32};
  const std::vector<Layout> plain = enumerate_layouts(main_job.model, s, 8, 64);
  EXPECT_TRUE(std::all_of(plain.begin(), plain.end(), [](const Layout& l) { return l.cp == 1; }));
  const std::vector<Layout> with_cp =
      enumerate_layouts(main_job.model, s, 8, 64, nullptr, {.size = 0, .comm = std::nullopt});
  bool a2a = false, p2p = false;
  for (const Layout& l : with_cp) {
    EXPECT_EQ(l.devices(), 8);
    EXPECT_TRUE(check_layout(main_job.model, l, s).empty()) << to_string(l);
    a2a = a2a || (l.cp > 1 && l.cp_comm == CpCommMode::a2a);
    p2p = p2p || (l.cp > 1 && l.cp_comm == CpCommMode::p2p);
  }
  EXPECT_TRUE(a2a && p2p);
  EXPECT_EQ(with_cp.size() - plain.size(),
            static_cast<std::size_t>(std::count_if(with_cp.begin(), with_cp.end(),
                                                   [](const Layout& l) { return l.cp > 1; })));
  // The cp ring at stride tp: tp 2 · cp 4 spans one 8-GPU node, tp 4 · cp 4 two.
  const ClusterSpec a100 = [] {
    ClusterSpec c = cluster_from("8xA100-80GB");
    c.nodes = 2;
    return c;
  }();
  const ModelPreset big = model_from("llama-33b");
  const TrainingSettings longctx{.seq = 32768, .global_batch = 16, .precision = Precision::bf16};
  const Plan p = account(
      big.model,
      {.tp = 2, .pp = 2, .dp = 1, .cp = 4, .accumulation = 16, .recompute = RecomputeMode::full},
      longctx, a100);
  ASSERT_EQ(p.comm.size(), 4u);
  EXPECT_EQ(p.comm[0].axis, Axis::dp);
  EXPECT_EQ(p.comm[0].size, 4);  // dp × cp
  EXPECT_EQ(p.comm[3].axis, Axis::cp);
  EXPECT_EQ(p.comm[3].link, LinkKind::intra_node);
  EXPECT_EQ(p.comm[2].link, LinkKind::inter_node);  // pp at stride 8
  EXPECT_GT(p.comm[3].time_s, 0.0);
  EXPECT_DOUBLE_EQ(p.step_s, p.compute_s / (1.0 - p.bubble) + p.exposed_comm_s);
  EXPECT_EQ(link_of_group(4, 4, a100), LinkKind::inter_node);  // tp 4 · cp 4 = 16
}

TEST(PlanCp, SeedLongChatRowDoesNotFitTheWorldAndGetsTheNearestLayouts) {
  const SeedLayoutRow& row = seed000_longchat();
  const Layout published = seed_layout(row);
  EXPECT_EQ(published.devices(), 64);
  const ClusterSpec cluster = seed_cluster(row);
  ASSERT_EQ(cluster.devices(), 16);
  const ModelPreset model = model_from(row.model_preset);
  EXPECT_NEAR(model_size(model.model).parameters, 32.5e9, 0.1e9);
  const LayoutDiagnosis d =
      diagnose_layout(model.model, published, seed_settings(row), cluster, {}, 64, 8);
  ASSERT_EQ(d.issues.size(), 1u);
  const std::string text = format_diagnosis(d, published, cluster);
  EXPECT_NE(text.find("2 × 2 × 4 × 4 = 64"), std::string::npos) << text;
  EXPECT_NE(text.find("16 devices"), std::string::npos) << text;
  ASSERT_FALSE(d.proposals.empty()) << text;
  bool cp4 = false;
  for (std::size_t i = 0; i < d.proposals.size(); ++i) {
    const Layout& l = d.proposals[i].layout;
    EXPECT_EQ(l.tp * l.pp * l.dp * l.cp, 16) << to_string(l);
    EXPECT_TRUE(d.proposals[i].fits);
    if (i > 0) {
      EXPECT_LE(d.changed[i - 1], d.changed[i]);
    }
    cp4 = cp4 || (l.cp == 4 && l.tp == 2);
  }
  EXPECT_TRUE(cp4) << text;
  EXPECT_EQ(d.changed.front(), 1) << text;  // one factor changed: dp 4 → 1 or cp 4 → 1
  EXPECT_NE(d.issues.front().fix.find(to_string(d.proposals.front().layout)), std::string::npos);
  // A layout that fills the cluster has nothing to diagnose.
  EXPECT_TRUE(diagnose_layout(model.model, d.proposals.front().layout, seed_settings(row), cluster)
                  .issues.empty());
}

}  // namespace
}  // namespace meshtrain::plan
