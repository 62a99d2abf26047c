// `meshtrain plan --emit` (plan/emit.h): the emitted flags, fed to the config loader on the
// plan's model config, give back a config check_config accepts whose every setting equals the
// plan's; the batch script carries the allocation and the same flags.
#include <gtest/gtest.h>

#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/plan/emit.h"
#include "meshtrain/plan/presets.h"
#include "meshtrain/plan/search.h"

namespace meshtrain::plan {
namespace {

// The config `meshtrain train` would run: the plan's model as a TOML file (every other key at
// its default) with the emitted flags as command-line overrides.
Config load_with_flags(const ModelConfig& model, const std::vector<std::string>& flags) {
  Config base;
  base.model = model;
  return load_config_text(to_toml(base), "model.toml", parse_overrides(flags));
}

// Every layout setting of `loaded` equals `planned`'s, and so does every other key (to_toml
// lists them all); check_config accepts it on the layout's devices.
void expect_round_trip(const ModelConfig& model, const Plan& plan) {
  SCOPED_TRACE(to_string(plan.layout));
  const std::vector<std::string> flags = train_flags(plan.config, model);
  const Config loaded = load_with_flags(model, flags);
  EXPECT_TRUE(check_config(loaded, static_cast<int>(plan.layout.devices())).empty());
  const Layout& l = plan.layout;
  EXPECT_EQ(loaded.parallel.tp, l.tp);
  EXPECT_EQ(loaded.parallel.pp, l.pp);
  EXPECT_EQ(loaded.parallel.dp, l.dp);
  EXPECT_EQ(loaded.parallel.cp, l.cp);
  EXPECT_EQ(loaded.parallel.ep, l.ep);
  EXPECT_EQ(loaded.parallel.cp_comm, l.cp_comm);
  EXPECT_EQ(loaded.parallel.virtual_stages, l.v);
  EXPECT_EQ(loaded.parallel.pp_schedule, l.schedule);
  EXPECT_EQ(loaded.parallel.zero_stage, l.zero_stage);
  EXPECT_EQ(loaded.parallel.sequence_parallel, l.sequence_parallel);
  EXPECT_EQ(loaded.training.micro_batch, l.micro_batch);
  EXPECT_EQ(loaded.training.accumulation, l.accumulation);
  EXPECT_EQ(loaded.training.global_batch, plan.config.training.global_batch);
  EXPECT_EQ(loaded.training.recompute, l.recompute);
  EXPECT_EQ(loaded.training.precision, plan.config.training.precision);
  EXPECT_EQ(loaded.model.block_size, plan.config.model.block_size);
  EXPECT_EQ(to_toml(loaded), to_toml(plan.config));
}

ModelConfig shakespeare() {
  return model_from(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/shakespeare_char.toml").model;
}

TEST(PlanEmit, TopLayoutOfASearchRoundTrips) {
  // configs/shakespeare_char.toml on this machine's 2 ranks, global batch 12 (the main job).
  const ModelConfig model = shakespeare();
  const SearchResult result =
      search(model, {.seq = model.block_size, .global_batch = 12, .precision = Precision::fp32},
             cluster_from("cpu-this-machine"));
  ASSERT_FALSE(result.ranked.empty());
  expect_round_trip(model, result.ranked.front());
  const std::vector<std::string> flags = train_flags(result.ranked.front().config, model);
  EXPECT_EQ(flags.size(), 30u);  // 15 settings, no model.block_size: seq is the model's
  EXPECT_EQ(flags[0], "--parallel.tp");
}

TEST(PlanEmit, EveryKindOfLayoutRoundTrips) {
  // Each string sets what a search may choose: tp with sequence parallelism, pipelines of every
  // schedule (interleaved with v = 2), cp with each attention, ZeRO stages, recompute modes,
  // micro-batches and accumulation, bf16/fp16.
  ModelConfig model = shakespeare();
  model.vocab_size = 65;
  const ClusterSpec cluster = cluster_from("cpu-this-machine");
  for (const auto& [text, precision] : std::vector<std::pair<std::string, Precision>>{
           {"tp=2,sp=true,mb=6", Precision::bf16},
           {"pp=2,mb=3,schedule=gpipe", Precision::fp32},
           {"pp=2,mb=3,schedule=interleaved_1f1b,v=2", Precision::fp32},
           {"pp=2,mb=1,schedule=zb_h1,recompute=full", Precision::fp16},
           {"cp=2,cp_comm=a2a,mb=2,zero=2", Precision::bf16},
           {"dp=2,zero=3,mb=2,recompute=selective", Precision::fp32}}) {
    const TrainingSettings settings{.seq = 64, .global_batch = 12, .precision = precision};
    const Layout layout = parse_layout(text, settings.global_batch);
    ASSERT_TRUE(check_layout(model, layout, settings).empty()) << text;
    expect_round_trip(model, account(model, layout, settings, cluster));
  }
}

TEST(PlanEmit, ExpertParallelLayoutRoundTrips) {
  const ModelConfig model =
      model_from(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/llama_moe.toml").model;
  const TrainingSettings settings{.seq = model.block_size, .global_batch = 12};
  const Layout layout = parse_layout("dp=2,ep=2,mb=6", settings.global_batch);
  ASSERT_TRUE(check_layout(model, layout, settings).empty());
  expect_round_trip(model, account(model, layout, settings, cluster_from("cpu-this-machine")));
}

TEST(PlanEmit, ASequenceLengthOfItsOwnIsEmittedAsTheBlockSize) {
  const ModelConfig model = shakespeare();
  const TrainingSettings settings{.seq = 32, .global_batch = 4, .precision = Precision::fp32};
  const Plan plan =
      account(model, parse_layout("dp=2,mb=2", 4), settings, cluster_from("cpu-this-machine"));
  const std::vector<std::string> flags = train_flags(plan.config, model);
  ASSERT_EQ(flags.size(), 32u);
  EXPECT_EQ(flags[30], "--model.block_size");
  EXPECT_EQ(flags[31], "32");
  expect_round_trip(model, plan);
}

TEST(PlanEmit, ShellJoinQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_join({"--parallel.tp", "2", "configs/a-b_c.toml"}),
            "--parallel.tp 2 configs/a-b_c.toml");
  EXPECT_EQ(shell_join({"my run/it's.toml", "$HOME", ""}), R"('my run/it'\''s.toml' '$HOME' '')");
}

TEST(PlanEmit, SbatchScriptAllocatesTheClusterAndRunsTheFlags) {
  const std::vector<std::string> flags = {"--parallel.dp", "16", "--training.micro_batch", "1"};
  const std::string script = sbatch_script(
      flags, {.nodes = 4, .ranks_per_node = 4, .config = "run one.toml", .layout = "tp=1 dp=16"});
  EXPECT_EQ(script.rfind("#!/bin/bash\n", 0), 0u);
  EXPECT_NE(script.find("\n#SBATCH --nodes=4\n"), std::string::npos) << script;
  EXPECT_NE(script.find("\n#SBATCH --ntasks-per-node=4\n"), std::string::npos) << script;
  EXPECT_NE(script.find("srun --mpi=pmix \"$MESHTRAIN\" train 'run one.toml' \\\n"
                        "  --parallel.dp 16 --training.micro_batch 1 \\\n"),
            std::string::npos)
      << script;
  EXPECT_NE(script.find("#   tp=1 dp=16\n"), std::string::npos) << script;
}

}  // namespace
}  // namespace meshtrain::plan
