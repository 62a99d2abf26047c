// Layouts, presets and the search (plan/layout.h, plan/presets.h, plan/cluster.h,
// plan/search.h): enumeration through the trainer's check_config, the placement rule, and the
// errors a user sees for bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/nearest.h"
#include "meshtrain/plan/presets.h"
#include "meshtrain/plan/report.h"
#include "meshtrain/plan/search.h"

namespace meshtrain::plan {
namespace {

std::string error_of(const auto& body) {
  try {
    body();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

ClusterSpec write_cluster(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / (name + ".toml");
  std::ofstream(path) << text;
  return cluster_from(path.string());
}

TEST(PlanLayout, EveryEnumeratedLayoutPassesCheckConfig) {
  const ModelPreset model =
      model_from(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/shakespeare_char.toml");
  const TrainingSettings settings{.seq = 64, .global_batch = 16, .precision = Precision::fp32};
  std::vector<Rejection> rejected;
  const std::vector<Layout> layouts = enumerate_layouts(model.model, settings, 8, 64, &rejected);
  ASSERT_FALSE(layouts.empty());
  bool saw_pp4 = false;
  for (const Layout& l : layouts) {
    EXPECT_TRUE(check_config(to_config(model.model, l, settings), 8).empty()) << to_string(l);
    EXPECT_EQ(l.devices(), 8);
    EXPECT_EQ(l.micro_batch * l.accumulation * l.dp, 16);
    EXPECT_NE(l.tp, 8) << "4 heads cannot be split over 8 ranks";
    EXPECT_FALSE(l.schedule == PipelineSchedule::zb_h1 && l.zero_stage >= 2) << to_string(l);
    saw_pp4 = saw_pp4 || l.pp == 4;
  }
  EXPECT_TRUE(saw_pp4);
  ASSERT_FALSE(rejected.empty());  // tp = 8, pp = 8 (> 4 layers), ... were refused by the rules
  EXPECT_GT(rejected.front().count, 0);
}

TEST(PlanLayout, ParseAndErrors) {
  const Layout l = parse_layout(
      "tp=8, pp=4,dp=2,zero=1,mb=1,recompute=selective,sp=true,v=1,"
      "schedule=1f1b",
      1024);
  EXPECT_EQ(l.tp, 8);
  EXPECT_EQ(l.pp, 4);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.zero_stage, 1);
  EXPECT_EQ(l.accumulation, 512);  // derived: 1024 / (1 · 2)
  EXPECT_EQ(l.recompute, RecomputeMode::selective);
  EXPECT_TRUE(l.sequence_parallel);
  EXPECT_EQ(parse_layout("dp=2,mb=2,m=3", 12).accumulation, 3);
  EXPECT_NE(error_of([] { parse_layout("tp=eight", 8); }).find("tp must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_layout("tq=2", 8); }).find("unknown key 'tq'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_layout("tp", 8); }).find("key=value"), std::string::npos);
  EXPECT_NE(
      error_of([] { parse_layout("recompute=some", 8); }).find("recompute must be one of: none ("),
      std::string::npos);
}

// Each mistake in --layout names the setting, the entry, the rule and a fix.
TEST(PlanLayout, RejectsRepeatedKeysEmptyEntriesAndOutOfRangeNumbers) {
  const auto issue_of = [](const std::string& text) {
    try {
      parse_layout(text, 8);
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.issues().size(), 1u) << text;
      return e.issues().front();
    }
    ADD_FAILURE() << text << " was accepted";
    return ConfigIssue{};
  };
  ConfigIssue i = issue_of("tp=2,tp=4");
  EXPECT_EQ(i.setting, "--layout");
  EXPECT_EQ(i.value, "tp=4");
  EXPECT_EQ(i.rule, "tp is given twice (tp=2, then tp=4)");
  EXPECT_EQ(i.fix, "give tp once: keep tp=2 or tp=4");
  EXPECT_EQ(issue_of("m=2,acc=4").rule, "m is given twice (m=2, then acc=4)");  // one key
  i = issue_of("tp=8,,");
  EXPECT_EQ(i.value, "tp=8,,");
  EXPECT_EQ(i.rule, "entry 2 of 3 is empty (two commas in a row, or a comma at an end)");
  EXPECT_EQ(i.fix, "drop the extra comma: tp=8");
  EXPECT_EQ(issue_of("tp=8,").rule,
            "entry 2 of 2 is empty (two commas in a row, or a comma at an end)");
  // Beyond int64, and beyond the 2^20 devices a plan may have: out of range, not "an integer".
  for (const char* text : {"tp=99999999999999999999", "tp=99999999999"}) {
    i = issue_of(text);
    EXPECT_EQ(i.value, text);
    EXPECT_EQ(i.rule, "tp is out of range: a mesh size is at most 2^20 (the devices a plan may have)");
    EXPECT_EQ(i.fix, "use a divisor of the cluster's devices, e.g. tp=8");
  }
  EXPECT_EQ(issue_of("mb=99999999999").rule,
            "mb is out of range: at most 2^24 (the sequences --global-batch may have)");
  EXPECT_EQ(issue_of("zero=99999999999999999999").rule,
            "zero is out of range: beyond a 64-bit integer");
  EXPECT_EQ(parse_layout("tp=1048576", 8).tp, 1 << 20);  // the bound itself parses
}

// A factor < 1 is reported by its own rule only: tp × pp × dp × cp of it says nothing more.
TEST(PlanLayout, ANonPositiveFactorIsItsOwnOnlyProblem) {
  const ModelPreset model = model_from("llama3-8b");
  const ClusterSpec cluster = cluster_from("8xH100-80GB");
  const TrainingSettings settings{.seq = 4096, .global_batch = 8};
  const LayoutDiagnosis d =
      diagnose_layout(model.model, parse_layout("tp=-8", 8), settings, cluster, {}, 8, 3);
  ASSERT_EQ(d.issues.size(), 1u);
  EXPECT_EQ(d.issues.front().setting, "parallel.tp");
  EXPECT_EQ(d.issues.front().value, "-8");
  EXPECT_EQ(d.issues.front().rule, "must be ≥ 1");
  // Too few devices but every factor ≥ 1: the product rule is the problem.
  const LayoutDiagnosis half =
      diagnose_layout(model.model, parse_layout("tp=4", 8), settings, cluster, {}, 8, 3);
  EXPECT_EQ(half.issues.back().setting, "tp × pp × dp × cp");
}

TEST(PlanLayout, PlacementPutsTpInsideANodeFirst) {
  const ClusterSpec c = cluster_from("8xA100-80GB");
  EXPECT_EQ(link_of_group(8, 1, c), LinkKind::intra_node);   // tp = 8
  EXPECT_EQ(link_of_group(2, 4, c), LinkKind::intra_node);   // dp = 2 after tp = 4
  EXPECT_EQ(link_of_group(2, 8, c), LinkKind::inter_node);   // dp = 2 after tp = 8
  EXPECT_EQ(link_of_group(16, 1, c), LinkKind::inter_node);  // tp = 16 spans two nodes
  EXPECT_EQ(link_of_group(3, 1, c), LinkKind::inter_node);   // groups of 3 straddle nodes
  EXPECT_EQ(link_of_group(1, 64, c), LinkKind::intra_node);  // no group, no traffic
}

TEST(PlanPresets, KnownAndUnknown) {
  const ModelPreset gpt3 = model_from("gpt3-175b");
  EXPECT_NEAR(model_size(gpt3.model).parameters, 175e9, 1.5e9);
  EXPECT_NEAR(model_size(model_from("llama3-8b").model).parameters, 8.03e9, 0.05e9);
  EXPECT_NEAR(model_size(model_from("llama3-70b").model).parameters, 70.6e9, 0.1e9);
  EXPECT_NEAR(model_size(model_from("llama3-405b").model).parameters, 405.9e9, 0.5e9);
  // A missing config file: what `plan --model` takes, not a `meshtrain train` command line.
  const std::string missing = error_of([] { model_from("/nonexistent/model.toml"); });
  EXPECT_NE(missing.find("--model = /nonexistent/model.toml"), std::string::npos) << missing;
  EXPECT_NE(missing.find("must be an existing, readable TOML file"), std::string::npos);
  EXPECT_NE(missing.find("or a preset: gpt3-175b, llama3-8b"), std::string::npos) << missing;
  EXPECT_EQ(missing.find("meshtrain train"), std::string::npos) << missing;
  const std::string unknown = error_of([] { model_from("gpt5"); });
  EXPECT_NE(unknown.find("unknown model preset"), std::string::npos);
  EXPECT_NE(unknown.find("llama3-70b"), std::string::npos);  // lists the known ones
  // Mixtral is planned since issue 14 (plan/moe.h; PlanMoe tests its counts).
  EXPECT_EQ(model_from("mixtral-8x7b").model.moe_experts, 8);
  const std::string cluster = error_of([] { cluster_from("8xV100"); });
  EXPECT_NE(cluster.find("unknown cluster preset"), std::string::npos);
  EXPECT_NE(cluster.find("8xH100-80GB"), std::string::npos);
  EXPECT_EQ(peak_flops_for(cluster_from("8xA100-80GB"), "bf16"), 312e12);
  EXPECT_EQ(peak_flops_for(cluster_from("8xA100-80GB"), "tf32"), 156e12);
  EXPECT_EQ(peak_flops_for(cluster_from("8xA100-80GB"), "fp32"), 19.5e12);
}

TEST(PlanPresets, ClusterFile) {
  const ClusterSpec c = write_cluster("plan_test_cluster",
                                      "name = \"test\"\ndevices_per_node = 4\nnodes = 2\n"
                                      "memory_gib = 40\n[peak_tflops]\nfp32 = 10\nbf16 = 100\n"
                                      "[intra_node]\nbandwidth_gb_per_s = 100\nlatency_us = 2\n"
                                      "[inter_node]\nbandwidth_gb_per_s = 10\n");
  EXPECT_EQ(c.devices(), 8);
  EXPECT_EQ(c.memory_bytes, 40.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(c.peak_flops_16bit, 100e12);
  EXPECT_EQ(c.intra_node.latency_s, 2e-6);
  EXPECT_EQ(c.inter_node.bandwidth_bytes_per_s, 10e9);
  EXPECT_NE(error_of([] {
              write_cluster("plan_test_bad", "devices_per_node = 4\nnodes = 1\n");
            }).find("memory_bytes"),
            std::string::npos);
  EXPECT_NE(error_of([] { cluster_from("/nonexistent/cluster.toml"); }).find("cluster file"),
            std::string::npos);
}

TEST(PlanSearch, RanksFittingLayoutsByStepTime) {
  const ModelPreset model = model_from("llama3-70b");
  ClusterSpec cluster = cluster_from("8xA100-80GB");
  cluster.nodes = 8;
  const TrainingSettings settings{.seq = 4096, .global_batch = 256, .precision = Precision::bf16};
  const SearchResult r = search(model.model, settings, cluster, {}, 4);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.fitting, static_cast<std::int64_t>(r.ranked.size()));
  EXPECT_LE(r.fitting, r.valid);
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    EXPECT_TRUE(r.ranked[i].fits);
    EXPECT_LE(r.ranked[i].peak.total(), 0.9 * cluster.memory_bytes);
    if (i > 0) {
      EXPECT_LE(r.ranked[i - 1].step_s, r.ranked[i].step_s);
    }
  }
  const std::string text = recommendation(r);
  EXPECT_EQ(text.rfind("Use " + to_string(r.ranked.front().layout), 0), 0u) << text;
  EXPECT_NE(format_table(r.ranked, cluster, 3).find(to_string(r.ranked[2].layout)),
            std::string::npos);
  EXPECT_NE(to_json(r, cluster, 2).find("\"step_s\""), std::string::npos);
}

TEST(PlanSearch, NothingFitsAndNoLayoutErrors) {
  // GPT-3 175B on one A100 node: valid layouts exist, none fits.
  ClusterSpec one_node = cluster_from("8xA100-80GB");
  const SearchResult r =
      search(model_from("gpt3-175b").model,
             {.seq = 2048, .global_batch = 8, .precision = Precision::bf16}, one_node, {}, 1);
  EXPECT_GT(r.valid, 0);
  EXPECT_TRUE(r.ranked.empty());
  EXPECT_NE(recommendation(r).find("No layout fits"), std::string::npos);
  // 7 devices for the main job: tp = 7 breaks the heads, pp = 7 the layers, dp = 7 the batch.
  const ClusterSpec seven = write_cluster("plan_test_seven",
                                          "devices_per_node = 7\nnodes = 1\nmemory_gib = 16\n"
                                          "[peak_tflops]\nfp32 = 1\n[intra_node]\n"
                                          "bandwidth_gb_per_s = 10\n[inter_node]\n"
                                          "bandwidth_gb_per_s = 1\n");
  const ModelPreset main_job =
      model_from(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/shakespeare_char.toml");
  const std::string message = error_of([&] {
    search(main_job.model, {.seq = 64, .global_batch = 8, .precision = Precision::fp32}, seven);
  });
  EXPECT_NE(message.find("no layout of 7 devices"), std::string::npos) << message;
}

}  // namespace
}  // namespace meshtrain::plan
