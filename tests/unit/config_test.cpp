// Tests of config/: TOML loading, command-line overrides, and every validation rule's message
// (setting, value, rule, fix), all before anything is allocated (DESIGN invariant 9).
#include <gtest/gtest.h>

#include <map>

#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/allocator.h"

namespace meshtrain {
namespace {

std::string issues_text(const Config& c, int world) {
  return format_config_issues(c.source, check_config(c, world));
}

TEST(ConfigLoad, TomlThenOverridesInOrder) {
  const Config c = load_config_text(
      "[model]\nn_layer = 6\n[training]\nlr = 3e-4\nlr_scaling = \"sqrt\"\n", "t.toml",
      parse_overrides({"--model.n_layer", "2", "--training.max_steps=7", "--model.bias", "false"}));
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.training.max_steps, 7);
  EXPECT_DOUBLE_EQ(c.training.lr, 3e-4);
  EXPECT_EQ(c.training.lr_scaling, "sqrt");
  EXPECT_FALSE(c.model.bias);
  EXPECT_EQ(c.model.n_head, 4);  // default kept
}

TEST(ConfigLoad, UnknownKeysAndWrongTypesAreAllReportedWithAFix) {
  try {
    load_config_text("[training]\nmax_step = 10\nlr = \"fast\"\n", "t.toml",
                     {{"parallel.dpp", "2"}, {"training.seed", "x"}});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.issues().size(), 4u);
    auto find = [&](std::string_view setting) -> const ConfigIssue& {
      for (const ConfigIssue& i : e.issues()) {
        if (i.setting == setting) return i;
      }
      ADD_FAILURE() << "no issue for " << setting;
      return e.issues()[0];
    };
    EXPECT_NE(find("training.max_step").fix.find("training.max_steps"), std::string::npos);
    EXPECT_NE(find("training.lr").rule.find("a finite number"), std::string::npos);
    EXPECT_NE(find("parallel.dpp").fix.find("parallel.dp"), std::string::npos);
    EXPECT_EQ(find("training.seed").value, "x");
  }
}

TEST(ConfigLoad, SyntaxErrorNamesLineAndMissingFileIsAConfigError) {
  try {
    load_config_text("[model]\nn_layer = = 3\n", "bad.toml");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.issues()[0].setting.find("bad.toml:2"), std::string::npos);
  }
  EXPECT_THROW(load_config_file("/nonexistent/x.toml"), ConfigError);
  EXPECT_THROW(parse_overrides({"--training.max_steps"}), ConfigError);
  EXPECT_THROW(parse_overrides({"max_steps", "3"}), ConfigError);
}

TEST(ConfigLoad, ToTomlRoundTrips) {
  Config c;
  c.training.lr = 2.5e-4;
  c.model.bias = false;
  c.data.dir = "some/dir";
  const Config back = load_config_text(to_toml(c), "round trip");
  EXPECT_DOUBLE_EQ(back.training.lr, 2.5e-4);
  EXPECT_FALSE(back.model.bias);
  EXPECT_EQ(back.data.dir, "some/dir");
  EXPECT_EQ(to_toml(back), to_toml(c));
}

TEST(ConfigValidate, DefaultsAreValidOnOneRank) {
  const Config defaults;
  EXPECT_TRUE(check_config(defaults, 1).empty());
}

TEST(ConfigValidate, IndivisibleGlobalBatchNamesTheThreeValuesAndAFix) {
  Config c;
  c.training.micro_batch = 4;
  c.training.accumulation = 2;
  c.parallel.dp = 2;
  c.training.global_batch = 12;
  const std::string text = issues_text(c, 2);
  EXPECT_NE(text.find("training.global_batch = 12"), std::string::npos) << text;
  EXPECT_NE(text.find("4 × 2 × 2 = 16"), std::string::npos) << text;
  EXPECT_NE(text.find("fix:  set training.micro_batch = 3"), std::string::npos) << text;
  c.training.global_batch = 16;
  EXPECT_TRUE(check_config(c, 2).empty());
}

TEST(ConfigValidate, HeadsMustDivideEmbedding) {
  Config c;
  c.model.n_embd = 130;
  c.model.n_head = 4;
  const std::string text = issues_text(c, 1);
  EXPECT_NE(text.find("model.n_embd = 130"), std::string::npos) << text;
  EXPECT_NE(text.find("divisible by model.n_head = 4"), std::string::npos) << text;
  EXPECT_NE(text.find("{1, 2, 5, 10, 13, 26, 65, 130}"), std::string::npos) << text;
}

TEST(ConfigValidate, WorldSizeMustEqualProductOfParallelSizes) {
  Config c;
  c.parallel.dp = 2;
  const std::string text = issues_text(c, 4);
  EXPECT_NE(text.find("1 × 2 × 1 × 1 = 2"), std::string::npos) << text;
  EXPECT_NE(text.find("ranks launched (4)"), std::string::npos) << text;
  EXPECT_NE(text.find("mpirun -np 2"), std::string::npos) << text;
}

TEST(ConfigValidate, OtherParallelSizesAreNotYetSupportedAndBadValuesAreCollected) {
  Config c;
  c.parallel.tp = 2;
  c.model.dropout = 0.1;
  c.training.lr_scaling = "cubic";
  c.training.min_lr = 1.0;
  const auto issues = check_config(c, 2);
  std::vector<std::string> settings;
  for (const auto& i : issues) settings.push_back(i.setting);
  EXPECT_NE(std::find(settings.begin(), settings.end(), "parallel.tp"), settings.end());
  EXPECT_NE(std::find(settings.begin(), settings.end(), "model.dropout"), settings.end());
  EXPECT_NE(std::find(settings.begin(), settings.end(), "training.lr_scaling"), settings.end());
  EXPECT_NE(std::find(settings.begin(), settings.end(), "training.min_lr"), settings.end());
  EXPECT_NE(issues_text(c, 2).find("not yet supported"), std::string::npos);
}

TEST(ConfigValidate, RejectsBeforeAnyAllocation) {
  TrackedAllocator& alloc = TrackedAllocator::instance();
  const std::int64_t before = alloc.total().current_bytes;
  alloc.reset_peaks();
  Config c;
  c.parallel.dp = 3;
  EXPECT_THROW(validate_or_throw(c, 2), ConfigError);
  EXPECT_EQ(alloc.total().peak_bytes, before);
}

TEST(ConfigValidate, BatchSizeLearningRateScalingRules) {
  Config c;
  c.training.lr = 1e-3;
  c.training.micro_batch = 12;
  c.parallel.dp = 4;  // global batch 48
  c.training.lr_base_batch = 12;
  c.training.lr_scaling = "linear";
  EXPECT_DOUBLE_EQ(scaled_peak_lr(c), 4e-3);
  c.training.lr_scaling = "sqrt";
  EXPECT_DOUBLE_EQ(scaled_peak_lr(c), 2e-3);
  c.training.lr_scaling = "none";
  EXPECT_DOUBLE_EQ(scaled_peak_lr(c), 1e-3);
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

TEST(ConfigLoad, SectionThatIsNotATableAndSuggestionsBySettingName) {
  try {
    load_config_text("model = 5\n", "t.toml", {{"optim.lr", "1"}, {"training.eps", "inf"}});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.issues().size(), 3u);
    std::map<std::string, const ConfigIssue*> by_setting;
    for (const ConfigIssue& i : e.issues()) by_setting[i.setting] = &i;
    ASSERT_EQ(by_setting.count("model"), 1u);
    ASSERT_EQ(by_setting.count("optim.lr"), 1u);
    ASSERT_EQ(by_setting.count("training.eps"), 1u);
    EXPECT_NE(by_setting["model"]->rule.find("must be a table"), std::string::npos);
    EXPECT_NE(by_setting["optim.lr"]->fix.find("`training.lr`"), std::string::npos);
    EXPECT_NE(by_setting["training.eps"]->rule.find("finite"), std::string::npos);
  }
}

TEST(ConfigValidate, MemoryEstimateRejectsWhatCannotFit) {
  Config c;
  c.model.vocab_size = 65;
  // The main job: 804,096 parameters → 12.9 MB of weights, gradients and Adam state, plus
  // ≈ 30 MB of activations at micro-batch 12 (the tracked allocator measured a 38 MiB peak).
  const double bytes = estimated_training_bytes(c);
  EXPECT_GT(bytes, 30e6);
  EXPECT_LT(bytes, 60e6);
  EXPECT_TRUE(check_memory(c, std::int64_t{1} << 30).empty());
  EXPECT_TRUE(check_memory(c, 0).empty()) << "unknown available memory never rejects";
  c.model.n_embd = 1'000'000'000;  // no int64 overflow: a huge estimate, one clear issue
  const auto issues = check_memory(c, std::int64_t{16} << 30);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_NE(issues[0].rule.find("GiB available"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain
