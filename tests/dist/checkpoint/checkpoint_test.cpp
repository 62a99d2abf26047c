// Sharded checkpoints (issue 6; checkpoint/sharded_checkpoint.h, DESIGN invariant 8):
// - resume: a run that saved at step 10 and continued to 20 against a second Trainer resumed
//   from that checkpoint: the losses of steps 11–20 bit-identical, for dp (ZeRO 0, 1, 3, with
//   accumulation), tp + sp, pp (1f1b, interleaved), fp16 with its loss scaler, at np 1, 2, 4;
// - resharding: a checkpoint saved under one layout loaded under others (sub-worlds of the
//   job's ranks) continues within 1e-5 of the run that did not stop, with the padded
//   vocabulary of 65;
// - corruption: a truncated shard, a flipped byte, a missing file and the metadata of another
//   model are each reported naming the file, nothing is loaded, and resume = "auto" falls back
//   to the previous complete checkpoint; keep_last and the COMPLETE marker.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "shared_dir.h"
#include "meshtrain/checkpoint/reshard.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using test::quiet;

fs::path shared_temp_dir(ProcessGroup& group) {
  return test::shared_temp_dir(group, "meshtrain_ckpt_");
}

// ---------------------------------------------------------------------------------------
// Resume, same layout: bit-identical.

struct ResumeCase {
  std::string name;
  ModelFamily family = ModelFamily::gpt2;
  std::int64_t dp = 1, tp = 1, pp = 1, v = 1, zero = 0, accumulation = 1;
  bool sp = false;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  Precision precision = Precision::fp32;
  bool async = true;
  std::int64_t cp = 1;
  CpCommMode cp_comm = CpCommMode::p2p;
  std::int64_t moe_ep = 0;  // > 0: the MoE llama (test::make_moe) at parallel.ep = moe_ep
  // data.sampler = "epoch" on a nanoGPT-format copy of the first `epoch_tokens` train tokens:
  // 2000 tokens are 62 windows of 33, so the 160 samples of 20 steps span 2.6 epochs and the
  // checkpoint at step 10 (sample 80) lies in the middle of the second.
  std::int64_t epoch_tokens = 0;
};

// A nanoGPT-style raw uint16 copy of the first `tokens` tokens of the prepared train split
// (and of the val split) in dir, written by rank 0.
void write_small_nanogpt_data(ProcessGroup& world, const fs::path& dir, std::int64_t tokens) {
  if (world.rank() == 0) {
    fs::create_directories(dir);
    for (const char* name : {"train.bin", "val.bin"}) {
      std::ifstream in(fs::path(test::test_data_dir()) / name, std::ios::binary);
      std::string bytes(static_cast<std::size_t>(2 * tokens), '\0');
      in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      std::ofstream(dir / name, std::ios::binary) << bytes;
    }
  }
  world.barrier();
}

Config resume_config(const ResumeCase& c) {
  // Global batch 8 whatever the layout.
  Config cfg = test::small_tp_config(c.family, c.dp, c.tp, c.sp, 8 / (c.dp * c.accumulation),
                                     c.accumulation);
  cfg.model.n_layer = 4;
  cfg.parallel.cp = c.cp;
  cfg.parallel.cp_comm = c.cp_comm;
  cfg.parallel.pp = c.pp;
  cfg.parallel.virtual_stages = c.v;
  cfg.parallel.pp_schedule = c.schedule;
  cfg.parallel.zero_stage = c.zero;
  cfg.training.precision = c.precision;
  cfg.training.eval_interval = 5;  // evaluation between saves must not disturb anything
  cfg.checkpoint.interval = 10;
  cfg.checkpoint.async = c.async;
  if (c.moe_ep > 0) test::make_moe(cfg, c.moe_ep);
  if (c.epoch_tokens > 0) {
    cfg.data.format = DataFormat::nanogpt;
    cfg.data.sampler = DataSampler::epoch;
    cfg.model.vocab_size = 65;  // nanoGPT's files record no vocabulary
  }
  return cfg;
}

std::vector<ResumeCase> resume_cases() {
  switch (test::launched_world_size()) {
    case 1:
      return {{.name = "single"},
              {.name = "single_fp16_accumulation", .accumulation = 2, .precision = Precision::fp16},
              {.name = "single_bf16_sync", .precision = Precision::bf16, .async = false},
              {.name = "single_epoch_sampler_nanogpt", .epoch_tokens = 2000}};
    case 2:
      return {{.name = "dp2_zero0_accumulation", .dp = 2, .accumulation = 2},
              {.name = "dp2_epoch_sampler_accumulation",
               .dp = 2,
               .accumulation = 2,
               .epoch_tokens = 2000},
              {.name = "dp2_zero1", .dp = 2, .zero = 1},
              {.name = "dp2_zero3_accumulation", .dp = 2, .zero = 3, .accumulation = 2},
              {.name = "tp2_sp_llama", .family = ModelFamily::llama, .tp = 2, .sp = true},
              {.name = "pp2_1f1b", .pp = 2, .accumulation = 4},
              {.name = "pp2_interleaved",
               .pp = 2,
               .v = 2,
               .accumulation = 4,
               .schedule = PipelineSchedule::interleaved_1f1b},
              {.name = "cp2_p2p_llama", .family = ModelFamily::llama, .cp = 2},
              {.name = "cp2_a2a", .cp = 2, .cp_comm = CpCommMode::a2a},
              // MoE: each ep rank saves and loads only its experts.
              {.name = "moe_dp2_ep2", .family = ModelFamily::llama, .dp = 2, .moe_ep = 2},
              {.name = "moe_dp2_ep2_zero3_accumulation",
               .family = ModelFamily::llama,
               .dp = 2,
               .zero = 3,
               .accumulation = 2,
               .moe_ep = 2}};
    case 4:
      return {{.name = "dp2_tp2_sp_zero3", .dp = 2, .tp = 2, .zero = 3, .sp = true},
              {.name = "pp2_dp2_zero1_interleaved",
               .dp = 2,
               .pp = 2,
               .v = 2,
               .zero = 1,
               .accumulation = 2,
               .schedule = PipelineSchedule::interleaved_1f1b},
              {.name = "pp2_tp2_sp_1f1b_llama",
               .family = ModelFamily::llama,
               .tp = 2,
               .pp = 2,
               .accumulation = 4,
               .sp = true},
              {.name = "dp2_cp2_zero3", .dp = 2, .zero = 3, .cp = 2},
              // ep 2 of dp 4: expert ZeRO-1 slices over the expert-data-parallel pairs.
              {.name = "moe_dp4_ep2_zero1",
               .family = ModelFamily::llama,
               .dp = 4,
               .zero = 1,
               .moe_ep = 2},
              {.name = "moe_dp2_ep2_pp2",
               .family = ModelFamily::llama,
               .dp = 2,
               .pp = 2,
               .accumulation = 2,
               .moe_ep = 2}};
    default:
      return {};
  }
}

void PrintTo(const ResumeCase& c, std::ostream* os) { *os << c.name; }

class ResumeLayout : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeLayout, StepsAfterTheCheckpointAreBitIdentical) {
  const ResumeCase& c = GetParam();
  const auto world = test::runtime().world_group();
  const fs::path dir = shared_temp_dir(*world);
  if (c.epoch_tokens > 0) write_small_nanogpt_data(*world, dir / "data", c.epoch_tokens);
  Config first = resume_config(c);
  if (c.epoch_tokens > 0) first.data.dir = (dir / "data").string();
  first.checkpoint.dir = (dir / "first").string();
  const std::vector<StepMetrics> want = Trainer(first, *world, quiet()).run();
  ASSERT_EQ(want.size(), 20u);

  Config second = resume_config(c);
  second.data.dir = first.data.dir;
  second.checkpoint.dir = (dir / "second").string();
  second.checkpoint.resume = (dir / "first" / "checkpoints" / "step-00000010").string();
  Trainer resumed(second, *world, quiet());
  EXPECT_EQ(resumed.start_step(), 10);
  const std::vector<StepMetrics> got = resumed.run();
  ASSERT_EQ(got.size(), 10u);
  for (std::size_t i = 0; i < got.size(); ++i) {
    // The loss, and the grad norm before clipping: a gradient state restored wrong (moments,
    // step count) shows in the norm even where Adam hides it in the loss.
    EXPECT_EQ(got[i].loss, want[10 + i].loss)
        << "step " << 11 + i << " differs by " << got[i].loss - want[10 + i].loss;
    EXPECT_EQ(got[i].grad_norm, want[10 + i].grad_norm) << "grad norm, step " << 11 + i;
  }
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

std::string resume_name(const ::testing::TestParamInfo<ResumeCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ResumeLayout, ::testing::ValuesIn(resume_cases()), resume_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ResumeLayout);

// ---------------------------------------------------------------------------------------
// Resharding: save under one layout, load under others.

struct LayoutShape {
  std::int64_t dp, tp, pp, v, zero;
  std::int64_t cp = 1;
};

// gpt2 (4 heads, vocabulary 65 padded under tp), 4 layers, global batch 8, 1f1b or
// interleaved. accumulation = 8 / (dp · micro_batch) with micro_batch 1 under pp (pp ≤ m).
Config reshard_config(const LayoutShape& s) {
  const std::int64_t micro = s.pp > 1 ? 1 : 8 / s.dp;
  Config cfg =
      test::small_tp_config(ModelFamily::gpt2, s.dp, s.tp, s.tp > 1, micro, 8 / (s.dp * micro));
  cfg.model.n_layer = 4;
  cfg.parallel.pp = s.pp;
  cfg.parallel.virtual_stages = s.v;
  cfg.parallel.pp_schedule =
      s.v > 1 ? PipelineSchedule::interleaved_1f1b : PipelineSchedule::one_f_one_b;
  cfg.parallel.zero_stage = s.zero;
  cfg.parallel.cp = s.cp;
  cfg.training.max_steps = 15;
  return cfg;
}

struct ReshardCase {
  std::string name;
  LayoutShape from;
  std::vector<LayoutShape> to;
};

std::vector<ReshardCase> reshard_cases() {
  switch (test::launched_world_size()) {
    case 4:
      return {{"tp2_pp2_zero0",
               {.dp = 1, .tp = 2, .pp = 2, .v = 1, .zero = 0},
               {{.dp = 4, .tp = 1, .pp = 1, .v = 1, .zero = 3},
                {.dp = 1, .tp = 1, .pp = 1, .v = 1, .zero = 0},
                {.dp = 2, .tp = 1, .pp = 2, .v = 2, .zero = 1},
                {.dp = 1, .tp = 4, .pp = 1, .v = 1, .zero = 0}}},
              // Context parallel: saved at cp 2 (ZeRO-1 over dp × cp), loaded at cp 1 and 4.
              {"dp2_cp2_zero1",
               {.dp = 2, .tp = 1, .pp = 1, .v = 1, .zero = 1, .cp = 2},
               {{.dp = 1, .tp = 1, .pp = 1, .v = 1, .zero = 0, .cp = 1},
                {.dp = 1, .tp = 1, .pp = 1, .v = 1, .zero = 0, .cp = 4},
                {.dp = 1, .tp = 2, .pp = 1, .v = 1, .zero = 3, .cp = 2}}}};
    case 8:
      return {{"dp2_tp2_pp2_zero3",
               {.dp = 2, .tp = 2, .pp = 2, .v = 1, .zero = 3},
               {{.dp = 4, .tp = 2, .pp = 1, .v = 1, .zero = 0},
                {.dp = 1, .tp = 1, .pp = 4, .v = 1, .zero = 0},
                {.dp = 2, .tp = 4, .pp = 1, .v = 1, .zero = 3},
                {.dp = 1, .tp = 2, .pp = 2, .v = 2, .zero = 0},
                {.dp = 1, .tp = 1, .pp = 1, .v = 1, .zero = 0}}}};
    default:
      return {};
  }
}

void PrintTo(const ReshardCase& c, std::ostream* os) { *os << c.name; }

class Reshard : public ::testing::TestWithParam<ReshardCase> {};

// fp32: another layout sums in another order (tp partial sums, dp means, ZeRO slices), ≈1e-7
// relative per step; five Adam steps stay well inside the 1e-5, while a piece loaded
// into the wrong place (a transposed or shifted shard, a lost moment) moves the loss by ≥ 1e-3.
constexpr double kReshardRtol = 1e-5;

TEST_P(Reshard, NextStepsMatchTheRunThatDidNotStop) {
  const ReshardCase& c = GetParam();
  const auto world = test::runtime().world_group();
  const fs::path dir = shared_temp_dir(*world);
  Config source = reshard_config(c.from);
  source.checkpoint.dir = (dir / "source").string();
  source.checkpoint.interval = 10;
  const std::vector<StepMetrics> want = Trainer(source, *world, quiet()).run();
  ASSERT_EQ(want.size(), 15u);
  const std::string checkpoint = (dir / "source" / "checkpoints" / "step-00000010").string();

  for (const LayoutShape& to : c.to) {
    const int size = static_cast<int>(to.dp * to.tp * to.pp * to.cp);
    const bool member = world->rank() < size;
    const auto sub = world->split(member ? 0 : 1, world->rank(), "world");
    if (member) {
      Config target = reshard_config(to);
      target.checkpoint.resume = checkpoint;
      Trainer trainer(target, *sub, quiet());
      const std::vector<StepMetrics> got = trainer.run();
      ASSERT_EQ(got.size(), 5u);
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i].loss, want[10 + i].loss, kReshardRtol * want[10 + i].loss)
            << "to dp " << to.dp << " cp " << to.cp << " tp " << to.tp << " pp " << to.pp << " v "
            << to.v << " zero " << to.zero << ", step " << 11 + i;
        // The global grad norm (before clipping) of the resharded model: every gradient
        // element, summed in the new layout's order.
        EXPECT_NEAR(got[i].grad_norm, want[10 + i].grad_norm, kReshardRtol * want[10 + i].grad_norm)
            << "grad norm, to dp " << to.dp << " tp " << to.tp << " pp " << to.pp << ", step "
            << 11 + i;
      }
    }
    world->barrier();
  }
  if (world->rank() == 0) fs::remove_all(dir);
}

std::string reshard_name(const ::testing::TestParamInfo<ReshardCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Reshard, ::testing::ValuesIn(reshard_cases()), reshard_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Reshard);

// ---------------------------------------------------------------------------------------
// Resharding a MoE model to another ep (issue 14): each ep rank saved only its experts; the
// checkpoint loads under another ep at load time, and `meshtrain reshard`
// (reshard_checkpoint) writes another ep's files offline, each target rank holding its ep
// rank's experts. Both continue within 1e-5 of the run that did not stop, and agree bit for
// bit. micro_batch 2 in every layout, so each MoE forward sees the same token set (the aux
// and z losses are over the tokens of a micro-batch; moe_equivalence_test.cpp).

struct EpLayout {
  std::int64_t dp, ep, tp, pp, zero;
};

std::string describe(const EpLayout& l) {
  return fmt::format("dp {} ep {} tp {} pp {} zero {}", l.dp, l.ep, l.tp, l.pp, l.zero);
}

Config ep_config(const EpLayout& l) {
  constexpr std::int64_t kMicro = 2;
  Config cfg =
      test::small_tp_config(ModelFamily::llama, l.dp, l.tp, false, kMicro, 8 / (kMicro * l.dp));
  test::make_moe(cfg, l.ep);
  cfg.parallel.pp = l.pp;
  cfg.parallel.zero_stage = l.zero;
  cfg.training.max_steps = 15;
  return cfg;
}

struct EpReshardCase {
  std::string name;
  EpLayout from;
  std::vector<EpLayout> to;
};

std::vector<EpReshardCase> ep_reshard_cases() {
  if (test::launched_world_size() != 4) return {};
  return {{"ep2_to_ep1",
           {.dp = 4, .ep = 2, .tp = 1, .pp = 1, .zero = 1},
           {{.dp = 1, .ep = 1, .tp = 1, .pp = 1, .zero = 0},
            {.dp = 2, .ep = 1, .tp = 1, .pp = 2, .zero = 3}}},
          {"ep1_to_ep4",
           {.dp = 4, .ep = 1, .tp = 1, .pp = 1, .zero = 0},
           {{.dp = 4, .ep = 4, .tp = 1, .pp = 1, .zero = 0},
            {.dp = 4, .ep = 4, .tp = 1, .pp = 1, .zero = 3},
            {.dp = 2, .ep = 2, .tp = 2, .pp = 1, .zero = 1}}}};
}

void PrintTo(const EpReshardCase& c, std::ostream* os) { *os << c.name; }

class EpReshard : public ::testing::TestWithParam<EpReshardCase> {};

TEST_P(EpReshard, OnlineAndOfflineMatchTheRunThatDidNotStop) {
  const EpReshardCase& c = GetParam();
  const auto world = test::runtime().world_group();
  const fs::path dir = shared_temp_dir(*world);
  Config source = ep_config(c.from);
  source.checkpoint.dir = (dir / "source").string();
  source.checkpoint.interval = 10;
  const std::vector<StepMetrics> want = Trainer(source, *world, quiet()).run();
  ASSERT_EQ(want.size(), 15u);
  const fs::path checkpoint = dir / "source" / "checkpoints" / "step-00000010";

  for (std::size_t k = 0; k < c.to.size(); ++k) {
    const EpLayout& to = c.to[k];
    const Config target = ep_config(to);
    // Offline: the checkpoint's own config with the target's layout (as `meshtrain reshard`
    // builds it), written by rank 0.
    const fs::path offline_root = dir / fmt::format("offline{}", k);
    std::string error;
    if (world->rank() == 0) {
      try {
        Config layout = CheckpointReader(checkpoint).config();
        layout.parallel = target.parallel;
        layout.training.micro_batch = target.training.micro_batch;
        layout.training.accumulation = target.training.accumulation;
        const fs::path written = reshard_checkpoint(checkpoint, layout, offline_root);
        for (const auto& [path, ep] :
             {std::pair{checkpoint, c.from.ep}, std::pair{written, to.ep}}) {
          const nlohmann::json meta = nlohmann::json::parse(std::ifstream(path / "metadata.json"));
          EXPECT_EQ(meta.at("state").at("mesh").at("ep").get<std::int64_t>(), ep)
              << path << ": the checkpoint's mesh must record ep";
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    ASSERT_EQ(error, "") << "reshard to " << describe(to);
    world->barrier();

    const int size = static_cast<int>(to.dp * to.tp * to.pp);
    const bool member = world->rank() < size;
    const auto sub = world->split(member ? 0 : 1, world->rank(), "world");
    if (member) {
      std::vector<std::vector<StepMetrics>> runs;
      for (const fs::path& from : {checkpoint, offline_root / "step-00000010"}) {
        Config resumed = target;
        resumed.checkpoint.resume = from.string();
        runs.push_back(Trainer(resumed, *sub, quiet()).run());
        ASSERT_EQ(runs.back().size(), 5u) << from;
      }
      for (std::size_t i = 0; i < 5; ++i) {
        const StepMetrics& got = runs[0][i];
        EXPECT_NEAR(got.loss, want[10 + i].loss, kReshardRtol * want[10 + i].loss)
            << "to " << describe(to) << ", step " << 11 + i;
        EXPECT_NEAR(got.grad_norm, want[10 + i].grad_norm, kReshardRtol * want[10 + i].grad_norm)
            << "grad norm, to " << describe(to) << ", step " << 11 + i;
        EXPECT_EQ(runs[1][i].loss, got.loss) << "offline and load-time resharding differ, to "
                                             << describe(to) << ", step " << 11 + i;
        EXPECT_EQ(runs[1][i].grad_norm, got.grad_norm)
            << "grad norm, offline vs load-time, to " << describe(to) << ", step " << 11 + i;
      }
    }
    world->barrier();
  }
  if (world->rank() == 0) fs::remove_all(dir);
}

std::string ep_reshard_name(const ::testing::TestParamInfo<EpReshardCase>& param) {
  return param.param.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, EpReshard, ::testing::ValuesIn(ep_reshard_cases()),
                         ep_reshard_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EpReshard);

// A MoE checkpoint is another model than the dense llama of the same sizes: loading it is
// refused naming model.moe_experts, at load time and by `meshtrain reshard`.
// Instantiated at np 2 only (dp 2 × ep 2), so no other world size skips it.
class EpCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(EpCheckpoint, ADenseConfigRefusesAMoeCheckpoint) {
  const auto world = test::runtime().world_group();
  const fs::path dir = shared_temp_dir(*world);
  Config moe = ep_config({.dp = 2, .ep = 2, .tp = 1, .pp = 1, .zero = 0});
  moe.training.max_steps = 6;
  moe.checkpoint.interval = 6;
  moe.checkpoint.dir = dir.string();
  Trainer(moe, *world, quiet()).run();
  const fs::path checkpoint = dir / "checkpoints" / "step-00000006";

  Config dense = ep_config({.dp = 2, .ep = 1, .tp = 1, .pp = 1, .zero = 0});
  dense.model.moe_experts = 0;
  dense.checkpoint.dir = (dir / "dense").string();
  Trainer fresh(dense, *world, quiet());
  try {
    fresh.load_checkpoint(checkpoint);
    ADD_FAILURE() << "a dense model loaded a MoE checkpoint";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe_experts: 4 vs 0"), std::string::npos)
        << e.what();
  }
  if (world->rank() == 0) {
    Config layout = CheckpointReader(checkpoint).config();
    layout.model.moe_experts = 0;
    try {
      reshard_checkpoint(checkpoint, layout, dir / "resharded");
      ADD_FAILURE() << "reshard changed a MoE model into a dense one";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("model.moe_experts: 4 vs 0"), std::string::npos)
          << e.what();
    }
  }
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

std::vector<int> ep_checkpoint_worlds() {
  if (test::launched_world_size() == 2) return {2};
  return {};
}
INSTANTIATE_TEST_SUITE_P(World, EpCheckpoint, ::testing::ValuesIn(ep_checkpoint_worlds()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EpCheckpoint);

// ---------------------------------------------------------------------------------------
// Corruption, fallback, retention.

Config corruption_config(int world) {
  Config cfg = test::small_config(world, 8 / world, 1);
  cfg.parallel.zero_stage = world > 1 ? 1 : 0;  // each rank reads only its own file
  cfg.training.max_steps = 10;
  cfg.checkpoint.interval = 5;
  return cfg;
}

// The masters of every optimizer shard, copied.
std::vector<std::vector<float>> masters_of(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const OptimizerShard& s : t.zero().shards()) {
    const auto v = s.master.span_f32();
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

enum class Damage { truncate, flip_byte, remove_file, foreign_metadata, edited_metadata };

class Corruption : public ::testing::TestWithParam<Damage> {};

TEST_P(Corruption, IsNamedNothingIsLoadedAndAutoFallsBack) {
  const Damage damage = GetParam();
  const auto world = test::runtime().world_group();
  const int last = world->size() - 1;
  const fs::path dir = shared_temp_dir(*world);
  Config cfg = corruption_config(world->size());
  cfg.checkpoint.dir = dir.string();
  Trainer(cfg, *world, quiet()).run();  // complete checkpoints at steps 5 and 10
  const fs::path newest = dir / "checkpoints" / "step-00000010";
  // The last rank's shard is damaged: under ZeRO-1 only that rank reads it, so the others
  // must learn the verdict from it.
  const fs::path shard = newest / fmt::format("rank-{:05d}.safetensors", last);
  std::string culprit = shard.string();
  if (world->rank() == 0) {
    switch (damage) {
      case Damage::truncate:
        fs::resize_file(shard, fs::file_size(shard) - 100);
        break;
      case Damage::flip_byte: {
        std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(-7, std::ios::end);
        char b = 0;
        f.read(&b, 1);
        b = static_cast<char>(b ^ 0x10);
        f.seekp(-7, std::ios::end);
        f.write(&b, 1);
        break;
      }
      case Damage::remove_file:
        fs::remove(shard);
        break;
      case Damage::edited_metadata: {  // one piece moved by hand: the COMPLETE hash catches it
        std::ifstream in(newest / "metadata.json");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const auto at = text.find("\"begin\": 0");
        ASSERT_NE(at, std::string::npos);
        text.replace(at, 11, "\"begin\": 1");
        std::ofstream(newest / "metadata.json", std::ios::trunc) << text;
        break;
      }
      case Damage::foreign_metadata: {
        Config other = corruption_config(world->size());
        other.model.n_layer = 3;
        other.checkpoint.dir = (dir / "other").string();
        other.training.max_steps = 5;
        const auto self = test::runtime().self_group();
        other.parallel.dp = 1;
        other.parallel.zero_stage = 0;
        other.training.micro_batch = 8;
        Trainer(other, *self, quiet()).run();
        // With its COMPLETE marker, whose hash vouches for it: the model check must catch it.
        for (const char* file : {"metadata.json", "COMPLETE"}) {
          fs::copy_file(dir / "other" / "checkpoints" / "step-00000005" / file, newest / file,
                        fs::copy_options::overwrite_existing);
        }
        break;
      }
    }
  }
  if (damage == Damage::foreign_metadata) culprit = "model.n_layer: 3 vs 2";
  if (damage == Damage::edited_metadata) culprit = (newest / "metadata.json").string() + ": XXH64";
  world->barrier();

  // An explicit directory: a DataError naming the culprit on every rank, the model untouched.
  Config load = corruption_config(world->size());
  load.checkpoint.dir = (dir / "load").string();
  Trainer fresh(load, *world, quiet());
  const auto before = masters_of(fresh);
  try {
    fresh.load_checkpoint(newest);
    ADD_FAILURE() << "a damaged checkpoint loaded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(culprit), std::string::npos) << e.what();
  }
  EXPECT_EQ(masters_of(fresh), before) << "a failed load changed the weights";
  EXPECT_EQ(fresh.start_step(), 0);

  // resume = "auto": the previous complete checkpoint.
  Config autoload = corruption_config(world->size());
  autoload.checkpoint.dir = dir.string();
  autoload.checkpoint.resume = "auto";
  Trainer resumed(autoload, *world, quiet());
  EXPECT_EQ(resumed.start_step(), 5);
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

std::string damage_name(const ::testing::TestParamInfo<Damage>& info) {
  constexpr const char* kNames[] = {"truncated_shard", "flipped_byte", "missing_file",
                                    "foreign_metadata", "edited_metadata"};
  return kNames[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Damages, Corruption,
                         ::testing::Values(Damage::truncate, Damage::flip_byte, Damage::remove_file,
                                           Damage::foreign_metadata, Damage::edited_metadata),
                         damage_name);

TEST(CheckpointRetention, KeepsTheNewestCompleteAndNeverLoadsAnIncompleteOne) {
  const auto world = test::runtime().world_group();
  const fs::path dir = shared_temp_dir(*world);
  Config cfg = corruption_config(world->size());
  cfg.checkpoint.dir = dir.string();
  cfg.training.max_steps = 20;
  cfg.checkpoint.keep_last = 2;
  Trainer(cfg, *world, quiet()).run();
  const std::vector<fs::path> complete = complete_checkpoints(dir / "checkpoints");
  ASSERT_EQ(complete.size(), 2u);
  EXPECT_EQ(complete[0].filename(), "step-00000020");
  EXPECT_EQ(complete[1].filename(), "step-00000015");
  EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step-00000010"));
  // A newer directory without COMPLETE (a save that died) is skipped by auto.
  world->barrier();
  if (world->rank() == 0) {
    fs::copy(complete[0], dir / "checkpoints" / "step-00000025");
    fs::remove(dir / "checkpoints" / "step-00000025" / "COMPLETE");
  }
  world->barrier();
  cfg.checkpoint.resume = "auto";
  Trainer resumed(cfg, *world, quiet());
  EXPECT_EQ(resumed.start_step(), 20);
  EXPECT_THROW(resumed.load_checkpoint(dir / "checkpoints" / "step-00000025"), DataError);
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

// A run resumed from an older checkpoint (a rollback, or auto's fallback) writes lower step
// numbers than the abandoned run left behind: its saves are still the newest (completion
// order), keep_last removes the abandoned ones, and auto resumes from what this run saved.
TEST(CheckpointRetention, ARunResumedFromAnOlderCheckpointKeepsItsOwnSaves) {
  const auto world = test::runtime().world_group();
  const fs::path dir = shared_temp_dir(*world);
  Config abandoned = corruption_config(world->size());
  abandoned.checkpoint.dir = dir.string();
  abandoned.training.max_steps = 30;
  abandoned.checkpoint.interval = 10;
  abandoned.checkpoint.keep_last = 3;
  Trainer(abandoned, *world, quiet()).run();  // 10, 20, 30
  Config rollback = abandoned;
  rollback.checkpoint.resume = (dir / "checkpoints" / "step-00000010").string();
  rollback.training.max_steps = 20;
  rollback.checkpoint.interval = 5;
  rollback.checkpoint.keep_last = 2;
  Trainer(rollback, *world, quiet()).run();  // 15, 20
  const std::vector<fs::path> complete = complete_checkpoints(dir / "checkpoints");
  ASSERT_EQ(complete.size(), 2u);
  EXPECT_EQ(complete[0].filename(), "step-00000020");
  EXPECT_EQ(complete[1].filename(), "step-00000015");
  Config again = rollback;
  again.checkpoint.resume = "auto";
  EXPECT_EQ(Trainer(again, *world, quiet()).start_step(), 20);
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain
