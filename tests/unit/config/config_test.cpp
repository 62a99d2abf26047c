// Tests of config/: TOML loading, command-line overrides, and every validation rule's message
// (setting, value, rule, fix), all before anything is allocated (DESIGN invariant 9).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/env_switch.h"

namespace meshtrain {
namespace {

std::string issues_text(const Config& c, int world) {
  return format_config_issues(c.source, check_config(c, world));
}

// The rendered ConfigError of loading `toml` with `overrides` ("" when it loads).
std::string load_error(const std::string& toml, const std::vector<Override>& overrides = {}) {
  try {
    load_config_text(toml, "t.toml", overrides);
  } catch (const ConfigError& e) {
    return format_config_issues("t.toml", e.issues());
  }
  return "";
}

TEST(ConfigLoad, TomlThenOverridesInOrder) {
  const Config c = load_config_text(
      "[model]\nn_layer = 6\n[training]\nlr = 3e-4\nlr_scaling = \"sqrt\"\n", "t.toml",
      parse_overrides({"--model.n_layer", "2", "--training.max_steps=7", "--model.bias", "false"}));
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.training.max_steps, 7);
  EXPECT_DOUBLE_EQ(c.training.lr, 3e-4);
  EXPECT_EQ(c.training.lr_scaling, LrScaling::sqrt);
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

// A whole number too large for int64 is out of range, not "not an integer"; a non-number stays
// a type error.
TEST(ConfigLoad, AWholeNumberBeyondInt64IsNamedAsOutOfRange) {
  try {
    load_config_text("", "t.toml",
                     {{"parallel.bucket_mib", "99999999999999999999"},
                      {"training.max_steps", "-99999999999999999999"},
                      {"training.seed", "1e3"}});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.issues().size(), 3u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_NE(e.issues()[i].rule.find("must fit a 64-bit integer"), std::string::npos)
          << e.issues()[i].setting << ": " << e.issues()[i].rule;
      EXPECT_NE(e.issues()[i].fix.find("<an integer>"), std::string::npos);
    }
    EXPECT_EQ(e.issues()[2].rule, "must be an integer");
  }
}

// The fix for an unknown key: Megatron-LM's or nanoGPT's name for a setting points at
// meshtrain's; a near typo gets "did you mean"; a key near nothing gets no misleading guess.
TEST(ConfigLoad, UnknownKeyFixesNameMegatronAliasesAndOnlyNearKeys) {
  const auto fix_for = [](const std::string& key) {
    try {
      load_config_text("", "t.toml", {{key, "1"}});
    } catch (const ConfigError& e) {
      return e.issues().empty() ? std::string("(no issue)") : e.issues()[0].fix;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(fix_for("training.fp16"), "set training.precision = \"fp16\"");
  EXPECT_EQ(fix_for("training.micro-batch-size"), "use training.micro_batch");
  EXPECT_EQ(fix_for("model.seq_length"), "use model.block_size");
  EXPECT_NE(fix_for("data.path").find("use data.dir"), std::string::npos);
  EXPECT_NE(fix_for("training.max_step").find("did you mean `training.max_steps`"),
            std::string::npos);
  EXPECT_NE(fix_for("optim.lr").find("did you mean `training.lr`"), std::string::npos);
  for (const char* far : {"training.bogus", "data.xyzzy", "model.something_else_entirely"}) {
    const std::string fix = fix_for(far);
    EXPECT_EQ(fix.find("did you mean"), std::string::npos) << far << ": " << fix;
    EXPECT_NE(fix.find("no setting is close"), std::string::npos) << far << ": " << fix;
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

TEST(ConfigValidate, ThreadsMustBeFromZeroTo1024) {
  Config c;
  for (const std::int64_t bad : {std::int64_t{-1}, std::int64_t{1025}, std::int64_t{100000}}) {
    c.training.threads = bad;
    const std::string text = issues_text(c, 1);
    EXPECT_NE(text.find("training.threads = " + std::to_string(bad)), std::string::npos) << text;
    EXPECT_NE(text.find("from 0 to 1024"), std::string::npos) << text;
  }
  for (const std::int64_t good : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1024}}) {
    c.training.threads = good;
    EXPECT_TRUE(check_config(c, 1).empty()) << good;
  }
}

// bucket_mib << 20 is the bucket in bytes: 2^43 MiB would wrap it negative (one bucket per
// parameter, silently) were it not rejected.
TEST(ConfigValidate, BucketMibMustBeFromOneMibToOneTib) {
  Config c;
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{1048577}, std::int64_t{1} << 43}) {
    c.parallel.bucket_mib = bad;
    const std::string text = issues_text(c, 1);
    EXPECT_NE(text.find("parallel.bucket_mib = " + std::to_string(bad)), std::string::npos)
        << text;
    EXPECT_NE(text.find("from 1 to 1048576 MiB"), std::string::npos) << text;
  }
  for (const std::int64_t good : {std::int64_t{1}, std::int64_t{4}, std::int64_t{1048576}}) {
    c.parallel.bucket_mib = good;
    EXPECT_TRUE(check_config(c, 1).empty()) << good;
  }
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
  c.parallel.ep = 2;  // expert parallel is not yet supported (tp, pp and cp are)
  c.model.dropout = 0.1;
  c.training.min_lr = 1.0;
  const auto issues = check_config(c, 2);
  std::vector<std::string> settings;
  for (const auto& i : issues) settings.push_back(i.setting);
  EXPECT_NE(std::find(settings.begin(), settings.end(), "parallel.ep"), settings.end());
  EXPECT_NE(std::find(settings.begin(), settings.end(), "model.dropout"), settings.end());
  EXPECT_NE(std::find(settings.begin(), settings.end(), "training.min_lr"), settings.end());
  EXPECT_NE(issues_text(c, 2).find("not yet supported"), std::string::npos);
}

// Context parallel's rules (docs/context_parallel.md): 2·cp chunks per sequence, Ulysses'
// whole heads per cp rank, sequence parallel over the local rows, and the cp_comm names.
TEST(ConfigValidate, ContextParallelRulesNameSettingValueRuleAndFix) {
  Config c;
  c.parallel.cp = 4;
  c.model.block_size = 60;  // 60 % (2·4) ≠ 0
  std::string text = issues_text(c, 4);
  EXPECT_NE(text.find("model.block_size = 60"), std::string::npos) << text;
  EXPECT_NE(text.find("2·cp = 8 equal chunks"), std::string::npos) << text;
  EXPECT_NE(text.find("multiple of 8"), std::string::npos) << text;
  c.model.block_size = 64;
  EXPECT_TRUE(check_config(c, 4).empty()) << issues_text(c, 4);

  c.parallel.cp_comm = CpCommMode::a2a;
  c.model.n_head = 6;
  c.model.n_embd = 192;  // 6 heads per tp rank do not split over cp = 4
  text = issues_text(c, 4);
  EXPECT_NE(text.find("model.n_head = 6"), std::string::npos) << text;
  EXPECT_NE(text.find("cp_comm = \"p2p\""), std::string::npos) << text;
  c.parallel.cp_comm = CpCommMode::p2p;  // ring attention has no head rule
  EXPECT_TRUE(check_config(c, 4).empty()) << issues_text(c, 4);

  Config sp;
  sp.model.n_head = 4;
  sp.parallel.cp = 2;
  sp.parallel.tp = 4;
  sp.parallel.sequence_parallel = true;
  sp.model.block_size = 36;  // 36 % 4 == 0, but the 18 rows per cp rank do not split over tp 4
  text = issues_text(sp, 8);
  EXPECT_NE(text.find("block_size / cp = 18"), std::string::npos) << text;
  sp.model.block_size = 0;
  sp.parallel.cp = 0;
  EXPECT_NE(issues_text(sp, 8).find("parallel.cp = 0"), std::string::npos);
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

// An on/off switch of the environment is 0 or 1; "off" or "true" is an error, never
// silently "on" (core/env_switch.h; the trainer agrees the verdict over the ranks, see
// SharedWindowPeers.ABadValueOnOneRankStopsEveryRank).
TEST(EnvSwitch, MustBeZeroOrOne) {
  for (const char* bad : {"off", "true", "", "2", " 1"}) {
    ::setenv(kShmAllReduceEnv, bad, 1);
    const std::optional<ConfigIssue> issue = env_switch_issue(kShmAllReduceEnv);
    ASSERT_TRUE(issue.has_value()) << "'" << bad << "'";
    EXPECT_EQ(issue->setting, "MESHTRAIN_SHM_ALL_REDUCE");
    EXPECT_EQ(issue->value, fmt::format("'{}'", bad));
    EXPECT_NE(issue->rule.find("must be 0 or 1"), std::string::npos) << issue->rule;
    EXPECT_THROW(env_switch(kShmAllReduceEnv, true), ConfigError) << bad;
  }
  for (const auto& [text, on] : {std::pair{"0", false}, std::pair{"1", true}}) {
    ::setenv(kShmAllReduceEnv, text, 1);
    EXPECT_FALSE(env_switch_issue(kShmAllReduceEnv).has_value()) << text;
    EXPECT_EQ(env_switch(kShmAllReduceEnv, !on), on) << text;
  }
  ::unsetenv(kShmAllReduceEnv);
  EXPECT_FALSE(env_switch_issue(kShmAllReduceEnv).has_value());
  EXPECT_TRUE(env_switch(kShmAllReduceEnv, true));
  EXPECT_FALSE(env_switch(kShmAllReduceEnv, false));
}

TEST(ConfigValidate, BatchSizeLearningRateScalingRules) {
  Config c;
  c.training.lr = 1e-3;
  c.training.micro_batch = 12;
  c.parallel.dp = 4;  // global batch 48
  c.training.lr_base_batch = 12;
  c.training.lr_scaling = LrScaling::linear;
  EXPECT_DOUBLE_EQ(scaled_peak_lr(c), 4e-3);
  c.training.lr_scaling = LrScaling::sqrt;
  EXPECT_DOUBLE_EQ(scaled_peak_lr(c), 2e-3);
  c.training.lr_scaling = LrScaling::none;
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

// Tensor parallelism, sequence parallelism and the Llama family: every rule names the setting,
// its value, the rule and a fix (format_config_issues renders them as "setting = value",
// "rule: …", "fix:  …").
namespace meshtrain {
namespace {

bool has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// A Llama-family config valid on one rank: bias off (the Config default is on, for gpt2).
Config llama() {
  Config c;
  c.model.family = ModelFamily::llama;
  c.model.bias = false;
  return c;
}

TEST(ConfigValidate, TensorParallelNeedsHeadsDivisibleByTp) {
  Config c;
  c.parallel.tp = 3;  // 4 heads
  const std::string text = issues_text(c, 3);
  EXPECT_TRUE(has(text, "model.n_head = 4")) << text;
  EXPECT_TRUE(has(text, "divisible by parallel.tp = 3")) << text;
  EXPECT_TRUE(has(text, "attention heads are split")) << text;
  EXPECT_TRUE(has(text, "fix:  choose parallel.tp from {1, 2, 4}")) << text;
  c.parallel.tp = 4;
  EXPECT_TRUE(check_config(c, 4).empty()) << issues_text(c, 4);
}

TEST(ConfigValidate, TensorParallelNeedsKvHeadsDivisibleByTp) {
  Config c = llama();
  c.model.n_kv_head = 2;  // 4 query heads, 2 kv heads: tp 4 splits the queries, not the kv
  c.parallel.tp = 4;
  const std::string text = issues_text(c, 4);
  EXPECT_TRUE(has(text, "model.n_kv_head = 2")) << text;
  EXPECT_TRUE(has(text, "key/value heads are split")) << text;
  EXPECT_TRUE(has(text, "divisible by parallel.tp = 4")) << text;
  EXPECT_TRUE(has(text, "fix:  choose parallel.tp from {1, 2}, or a larger model.n_kv_head"))
      << text;
  EXPECT_FALSE(has(text, "model.n_head =")) << text;
  c.parallel.tp = 2;
  EXPECT_TRUE(check_config(c, 2).empty()) << issues_text(c, 2);
}

TEST(ConfigValidate, TensorParallelNeedsAnExplicitFfnHiddenDivisibleByTp) {
  Config c = llama();
  c.model.ffn_hidden = 350;
  c.parallel.tp = 4;
  const std::string text = issues_text(c, 4);
  EXPECT_TRUE(has(text, "model.ffn_hidden = 350")) << text;
  EXPECT_TRUE(has(text, "MLP hidden size must be divisible by parallel.tp = 4")) << text;
  EXPECT_TRUE(has(text, "fix:  set model.ffn_hidden to a multiple of 4")) << text;
  c.model.ffn_hidden = 352;
  EXPECT_TRUE(check_config(c, 4).empty()) << issues_text(c, 4);
}

TEST(ConfigValidate, TensorParallelChecksTheFamilysDefaultFfnHidden) {
  // gpt2's default 4·n_embd = 512 is not divisible by 3 (nor are the 4 heads).
  Config gpt2;
  gpt2.parallel.tp = 3;
  const std::string text = issues_text(gpt2, 3);
  EXPECT_TRUE(has(text, "model.ffn_hidden = 0 (the gpt2 default for n_embd = 128: 512)")) << text;
  EXPECT_TRUE(has(text, "divisible by parallel.tp = 3")) << text;
  EXPECT_TRUE(has(text, "fix:  set model.ffn_hidden to a multiple of 3")) << text;
  // llama's default for n_embd 96 is 2/3·384 = 256 (rounded to 256): heads 3 | tp 3, F does not.
  Config c = llama();
  c.model.n_embd = 96;
  c.model.n_head = 3;
  c.parallel.tp = 3;
  const auto issues = check_config(c, 3);
  ASSERT_EQ(issues.size(), 1u) << issues_text(c, 3);
  EXPECT_EQ(issues[0].setting, "model.ffn_hidden");
  EXPECT_EQ(issues[0].value, "0 (the llama default for n_embd = 96: 256)");
  c.model.ffn_hidden = 258;  // an explicit value replaces the rule
  EXPECT_TRUE(check_config(c, 3).empty()) << issues_text(c, 3);
}

TEST(ConfigValidate, SequenceParallelNeedsBlockSizeDivisibleByTpAndOnlyThen) {
  Config c;
  c.model.block_size = 63;
  c.parallel.tp = 2;
  EXPECT_TRUE(check_config(c, 2).empty()) << "without sequence parallel T is never split";
  c.parallel.sequence_parallel = true;
  const std::string text = issues_text(c, 2);
  EXPECT_TRUE(has(text, "model.block_size = 63")) << text;
  EXPECT_TRUE(has(text, "the tokens of a micro-batch are split over the tp ranks")) << text;
  EXPECT_TRUE(has(text, "divisible by parallel.tp = 2")) << text;
  EXPECT_TRUE(has(text,
                  "fix:  set model.block_size to a multiple of 2, or "
                  "parallel.sequence_parallel = false"))
      << text;
  c.model.block_size = 64;
  EXPECT_TRUE(check_config(c, 2).empty()) << issues_text(c, 2);
  c.parallel.tp = 1;  // sequence parallel on one tp rank changes nothing and is allowed
  c.model.block_size = 63;
  EXPECT_TRUE(check_config(c, 1).empty()) << issues_text(c, 1);
}

TEST(ConfigValidate, LlamaHasNoBiases) {
  Config c = llama();
  c.model.bias = true;
  const std::string text = issues_text(c, 1);
  EXPECT_TRUE(has(text, "model.bias = true")) << text;
  EXPECT_TRUE(has(text, "llama has no biases")) << text;
  EXPECT_TRUE(has(text, "fix:  set model.bias = false")) << text;
}

TEST(ConfigValidate, LlamaNeedsAnEvenHeadSizeForRotaryEmbedding) {
  Config c = llama();
  c.model.n_embd = 120;
  c.model.n_head = 8;  // head size 15
  const std::string text = issues_text(c, 1);
  EXPECT_TRUE(has(text, "model.n_embd = 120")) << text;
  EXPECT_TRUE(has(text, "even head size n_embd/n_head (= 15)")) << text;
  EXPECT_TRUE(has(text, "rotary")) << text;
  EXPECT_TRUE(has(text, "fix:  choose n_embd and n_head so that n_embd/n_head is even")) << text;
  Config gpt2;
  gpt2.model.n_embd = 120;
  gpt2.model.n_head = 8;
  EXPECT_TRUE(check_config(gpt2, 1).empty()) << "gpt2 has no rotary embedding";
}

TEST(ConfigValidate, Gpt2HasNoGroupedQueryAttention) {
  Config c;
  c.model.n_kv_head = 2;
  const std::string text = issues_text(c, 1);
  EXPECT_TRUE(has(text, "model.n_kv_head = 2")) << text;
  EXPECT_TRUE(has(text, "gpt2 has no grouped-query attention")) << text;
  EXPECT_TRUE(has(text, "fix:  set model.n_kv_head = 0, or model.family = \"llama\"")) << text;
  c.model.n_kv_head = 4;  // = n_head: plain multi-head attention
  EXPECT_TRUE(check_config(c, 1).empty()) << issues_text(c, 1);
  c.model.n_kv_head = 0;
  EXPECT_TRUE(check_config(c, 1).empty()) << issues_text(c, 1);
}

TEST(ConfigValidate, KvHeadsMustDivideHeads) {
  Config c = llama();
  c.model.n_kv_head = 3;  // 4 query heads
  const std::string text = issues_text(c, 1);
  EXPECT_TRUE(has(text, "model.n_kv_head = 3")) << text;
  EXPECT_TRUE(has(text, "must divide model.n_head = 4")) << text;
  EXPECT_TRUE(has(text, "grouped-query attention")) << text;
  EXPECT_TRUE(has(text, "fix:  choose model.n_kv_head from {1, 2, 4}")) << text;
  for (std::int64_t kv : {1, 2, 4}) {
    c.model.n_kv_head = kv;
    EXPECT_TRUE(check_config(c, 1).empty()) << issues_text(c, 1);
  }
}

TEST(ConfigValidate, UnknownFamilyNamesTheKnownOnes) {
  const std::string text = load_error("[model]\nfamily = \"bert\"\n");
  EXPECT_TRUE(has(text, "model.family = 'bert'")) << text;
  EXPECT_TRUE(has(text, "gpt2 (LayerNorm, GELU, learned positions), llama (")) << text;
  EXPECT_TRUE(has(text, "fix:  set model.family = \"gpt2\" (or llama)")) << text;
}

TEST(ConfigValidate, WorldSizeMismatchWithTensorParallelSuggestsTheRightDp) {
  Config c;
  c.parallel.tp = 2;
  const std::string text = issues_text(c, 4);  // 4 ranks launched, 1 × 1 × 1 × 2 configured
  EXPECT_TRUE(has(text, "1 × 1 × 1 × 2 = 2")) << text;
  EXPECT_TRUE(has(text, "ranks launched (4)")) << text;
  EXPECT_TRUE(has(text, "mpirun -np 2")) << text;
  EXPECT_TRUE(has(text, "--parallel.dp 2")) << text;
  c.parallel.dp = 2;
  EXPECT_TRUE(check_config(c, 4).empty()) << issues_text(c, 4);
  // 3 ranks cannot hold tp 2 at any dp: only the launch fix.
  c.parallel.dp = 1;
  const std::string odd = issues_text(c, 3);
  EXPECT_TRUE(has(odd, "mpirun -np 2")) << odd;
  EXPECT_FALSE(has(odd, "--parallel.dp")) << odd;
}

TEST(ConfigValidate, NegativeFfnHiddenAndKvHeadsAreRejected) {
  Config c = llama();
  c.model.ffn_hidden = -1;
  c.model.n_kv_head = -2;
  const std::string text = issues_text(c, 1);
  EXPECT_TRUE(has(text, "model.ffn_hidden = -1")) << text;
  EXPECT_TRUE(has(text, "model.n_kv_head = -2")) << text;
  EXPECT_TRUE(has(text, "must be ≥ 0 (0 = the family's rule")) << text;
  EXPECT_TRUE(has(text, "must be ≥ 0 (0 = n_head)")) << text;
  EXPECT_TRUE(has(text, "fix:  leave it at 0")) << text;
}

TEST(ConfigValidate, NormEpsAndRopeThetaMustBePositive) {
  for (double bad : {0.0, -1.0}) {
    Config c = llama();
    c.model.norm_eps = bad;
    c.model.rope_theta = bad;
    const std::string value = bad == 0.0 ? "0" : "-1";
    const std::string text = issues_text(c, 1);
    EXPECT_TRUE(has(text, "model.norm_eps = " + value)) << text;
    EXPECT_TRUE(has(text, "model.rope_theta = " + value)) << text;
    EXPECT_TRUE(has(text, "must be > 0")) << text;
    EXPECT_TRUE(has(text, "fix:  use 1e-5")) << text;
    EXPECT_TRUE(has(text, "fix:  use 10000 (Llama 2) or 500000 (Llama 3)")) << text;
    EXPECT_EQ(check_config(c, 1).size(), 2u) << text;
  }
}

TEST(ConfigValidate, TensorAndSequenceParallelWithAVocabularyNotDivisibleByTpIsValid) {
  Config c;
  c.model.vocab_size = 65;  // padded to 2·33 rows, never a config error
  c.parallel.tp = 2;
  c.parallel.sequence_parallel = true;
  EXPECT_TRUE(check_config(c, 2).empty()) << issues_text(c, 2);
  EXPECT_TRUE(check_memory(c, std::int64_t{1} << 30).empty());
  c.parallel.dp = 2;
  c.training.micro_batch = 6;
  EXPECT_TRUE(check_config(c, 4).empty()) << issues_text(c, 4);
  Config l = llama();
  l.model.vocab_size = 65;
  l.model.n_kv_head = 2;
  l.parallel.tp = 2;
  l.parallel.sequence_parallel = true;
  EXPECT_TRUE(check_config(l, 2).empty()) << issues_text(l, 2);
}

TEST(ConfigValidate, FfnHiddenAndKvHeadsFollowTheFamilyRulesUnlessSet) {
  ModelConfig m;                     // gpt2, n_embd 128, n_head 4
  EXPECT_EQ(ffn_hidden_of(m), 512);  // 4·C
  m.n_embd = 768;
  EXPECT_EQ(ffn_hidden_of(m), 3072);
  m.family = ModelFamily::llama;
  EXPECT_EQ(ffn_hidden_of(m), 2048);  // 2/3·3072 = 2048, already a multiple of 256
  m.n_embd = 128;
  EXPECT_EQ(ffn_hidden_of(m), 512);  // 2/3·512 = 341 → 512
  m.n_embd = 96;
  EXPECT_EQ(ffn_hidden_of(m), 256);  // 2/3·384 = 256
  m.n_embd = 4096;
  EXPECT_EQ(ffn_hidden_of(m), 11008);  // Llama 7B: 2/3·16384 = 10922 → 11008
  m.ffn_hidden = 352;
  EXPECT_EQ(ffn_hidden_of(m), 352);  // an explicit size wins
  m.family = ModelFamily::gpt2;
  EXPECT_EQ(ffn_hidden_of(m), 352);
  EXPECT_EQ(kv_heads_of(m), 4);  // 0 = n_head
  m.n_kv_head = 2;
  EXPECT_EQ(kv_heads_of(m), 2);
}

TEST(ConfigLoad, NewModelAndParallelKeysLoadFromAFileAndFromOverrides) {
  namespace fs = std::filesystem;
  const fs::path path =
      fs::temp_directory_path() /
      ("meshtrain_config_test_" +
       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + ".toml");
  {
    std::ofstream out(path);
    out << "[model]\nfamily = \"llama\"\nbias = false\nn_kv_head = 2\nffn_hidden = 384\n"
           "norm_eps = 1e-6\nrope_theta = 500000.0\n[parallel]\ntp = 2\n"
           "sequence_parallel = true\n";
  }
  const Config f = load_config_file(path);
  fs::remove(path);
  EXPECT_EQ(f.model.family, ModelFamily::llama);
  EXPECT_EQ(f.model.n_kv_head, 2);
  EXPECT_EQ(f.model.ffn_hidden, 384);
  EXPECT_DOUBLE_EQ(f.model.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(f.model.rope_theta, 500000.0);
  EXPECT_EQ(f.parallel.tp, 2);
  EXPECT_TRUE(f.parallel.sequence_parallel);
  EXPECT_TRUE(check_config(f, 2).empty()) << issues_text(f, 2);

  const Config o = load_config_text(
      "", "overrides",
      parse_overrides({"--model.family", "llama", "--model.bias", "false", "--model.n_kv_head", "2",
                       "--model.ffn_hidden=256", "--model.norm_eps", "1e-6", "--model.rope_theta",
                       "5e5", "--parallel.tp", "2", "--parallel.sequence_parallel", "true"}));
  EXPECT_EQ(o.model.n_kv_head, 2);
  EXPECT_EQ(o.model.ffn_hidden, 256);
  EXPECT_DOUBLE_EQ(o.model.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(o.model.rope_theta, 5e5);
  EXPECT_EQ(o.parallel.tp, 2);
  EXPECT_TRUE(o.parallel.sequence_parallel);
  EXPECT_TRUE(check_config(o, 2).empty()) << issues_text(o, 2);
  // And they survive the run log / checkpoint round trip.
  EXPECT_EQ(to_toml(load_config_text(to_toml(o), "round trip")), to_toml(o));
}

// parallel.overlap_grad_reduce (parallel/dp/grad_buckets.h): on by default, off from a file
// or the command line, a non-bool reported naming the key, and kept by the round trip.
TEST(ConfigLoad, OverlapGradReduceDefaultsOnLoadsAndRejectsNonBools) {
  EXPECT_TRUE(Config{}.parallel.overlap_grad_reduce);
  const Config f = load_config_text("[parallel]\noverlap_grad_reduce = false\n", "t.toml");
  EXPECT_FALSE(f.parallel.overlap_grad_reduce);
  const Config o = load_config_text("", "overrides",
                                    parse_overrides({"--parallel.overlap_grad_reduce", "false"}));
  EXPECT_FALSE(o.parallel.overlap_grad_reduce);
  EXPECT_TRUE(check_config(o, 1).empty()) << issues_text(o, 1);
  EXPECT_EQ(to_toml(load_config_text(to_toml(o), "round trip")), to_toml(o));
  try {
    load_config_text("", "t.toml", {{"parallel.overlap_grad_reduce", "sometimes"}});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(has(e.what(), "parallel.overlap_grad_reduce = sometimes")) << e.what();
  }
}

TEST(ConfigLoad, NewKeysWithTheWrongTypeAreReported) {
  try {
    load_config_text("[model]\nn_kv_head = \"two\"\n", "t.toml",
                     {{"parallel.sequence_parallel", "maybe"}, {"model.rope_theta", "x"}});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.issues().size(), 3u) << e.what();
    const std::string text = e.what();
    EXPECT_TRUE(has(text, "model.n_kv_head")) << text;
    EXPECT_TRUE(has(text, "parallel.sequence_parallel = maybe")) << text;
    EXPECT_TRUE(has(text, "model.rope_theta = x")) << text;
  }
}

TEST(ConfigLoad, LlamaShakespeareConfigLoadsAndValidatesOnOneRankAndWithTp2) {
  const auto path = std::filesystem::path(MESHTRAIN_SOURCE_DIR) / "configs/llama_shakespeare.toml";
  Config c = load_config_file(path);
  EXPECT_EQ(c.model.family, ModelFamily::llama);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_EQ(c.model.ffn_hidden, 352);
  EXPECT_FALSE(c.model.bias);
  EXPECT_DOUBLE_EQ(c.model.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 10000.0);
  EXPECT_TRUE(check_config(c, 1).empty()) << issues_text(c, 1);
  c.model.vocab_size = 65;
  EXPECT_TRUE(check_memory(c, std::int64_t{1} << 30).empty());

  const Config tp2 = load_config_file(
      path, parse_overrides({"--parallel.tp", "2", "--parallel.sequence_parallel", "true"}));
  EXPECT_TRUE(check_config(tp2, 2).empty()) << issues_text(tp2, 2);
  const Config tp4 = load_config_file(path, parse_overrides({"--parallel.tp", "4"}));
  EXPECT_TRUE(has(issues_text(tp4, 4), "model.n_kv_head = 2")) << "2 kv heads do not split in 4";
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

TEST(ConfigValidate, RecomputeIsNoneSelectiveOrFull) {
  Config c;
  for (const auto& [mode, name, what] : kRecomputeModeNames) {
    c.training.recompute = mode;
    EXPECT_TRUE(check_config(c, 1).empty()) << name;
  }
  const std::string text = load_error("", {{"training.recompute", "everything"}});
  EXPECT_NE(text.find("training.recompute = everything"), std::string::npos) << text;
  EXPECT_NE(text.find("must be one of: none (keep every activation), selective (the attention "
                      "core), full (whole blocks)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("fix:  pass --training.recompute none (or selective, full)"),
            std::string::npos)
      << text;
}

TEST(ConfigValidate, ZeroStageIsZeroToThreeAndTwoOrThreeRejectsZbH1) {
  Config c;
  for (int stage = 0; stage <= 3; ++stage) {
    c.parallel.zero_stage = stage;
    EXPECT_TRUE(check_config(c, 1).empty()) << stage;
  }
  c.parallel.zero_stage = 4;
  std::string text = format_config_issues(c.source, check_config(c, 1));
  EXPECT_NE(text.find("parallel.zero_stage = 4"), std::string::npos) << text;
  EXPECT_NE(text.find("must be 0, 1, 2 or 3"), std::string::npos) << text;
  c.parallel.zero_stage = 2;
  c.parallel.pp = 2;
  c.model.n_layer = 4;
  c.training.accumulation = 4;
  c.parallel.pp_schedule = PipelineSchedule::zb_h1;
  text = format_config_issues(c.source, check_config(c, 2));
  EXPECT_NE(text.find("zb_h1 computes the weight gradients later"), std::string::npos) << text;
  c.parallel.zero_stage = 1;
  EXPECT_TRUE(check_config(c, 2).empty()) << format_config_issues(c.source, check_config(c, 2));
}

TEST(ConfigValidate, PrecisionAndFp16LossScalerSettings) {
  Config c;
  for (const auto& [precision, name, what] : kPrecisionNames) {
    c.training.precision = precision;
    EXPECT_TRUE(check_config(c, 1).empty()) << name;
  }
  std::string text = load_error("", {{"training.precision", "fp8"}});
  EXPECT_NE(text.find("training.precision = fp8"), std::string::npos) << text;
  // Scaler settings that cannot work are rejected under fp16, each by name.
  c.training.precision = Precision::fp16;
  c.training.loss_scale_init = 0.0;
  c.training.loss_scale_growth = 1e300;
  c.training.loss_scale_backoff = 1.5;
  c.training.loss_scale_growth_interval = 0;
  c.training.loss_scale_hysteresis = 0;
  const auto issues = check_config(c, 1);
  EXPECT_EQ(issues.size(), 5U);
  text = format_config_issues(c.source, issues);
  for (const char* key :
       {"training.loss_scale_init = 0", "training.loss_scale_growth = 1e+300",
        "training.loss_scale_backoff = 1.5", "training.loss_scale_growth_interval = 0",
        "training.loss_scale_hysteresis = 0"}) {
    EXPECT_NE(text.find(key), std::string::npos) << key << "\n" << text;
  }
  // The same settings do not matter in bf16 (no scaler).
  c.training.precision = Precision::bf16;
  EXPECT_TRUE(check_config(c, 1).empty());
}

TEST(ConfigValidate, ModelStateBytesPerParameterFollowTheZeroFormulas) {
  Config c;
  c.parallel.dp = 4;
  const double want_fp32[] = {16.0, 8.0 + 8.0 / 4, 4.0 + 12.0 / 4, 16.0 / 4};
  const double want_mixed[] = {18.0, 6.0 + 12.0 / 4, 2.0 + 16.0 / 4, 16.0 / 4};
  for (int stage = 0; stage <= 3; ++stage) {
    c.parallel.zero_stage = stage;
    c.training.precision = Precision::fp32;
    EXPECT_DOUBLE_EQ(model_state_bytes_per_parameter(c), want_fp32[stage]) << stage;
    c.training.precision = Precision::bf16;
    EXPECT_DOUBLE_EQ(model_state_bytes_per_parameter(c), want_mixed[stage]) << stage;
  }
  // A model the memory check refuses at ZeRO-0 fits once ZeRO-3 shards its state.
  c.training.precision = Precision::fp32;
  c.model.n_layer = 24;
  c.model.n_embd = 2048;
  c.model.vocab_size = 65;
  c.training.micro_batch = 1;
  c.parallel.zero_stage = 0;
  const double need0 = estimated_training_bytes(c);
  c.parallel.zero_stage = 3;
  const double need3 = estimated_training_bytes(c);
  EXPECT_LT(need3, 0.3 * need0);
  EXPECT_FALSE(check_memory(c, static_cast<std::int64_t>(0.5 * need0)).size() > 0);
  c.parallel.zero_stage = 0;
  EXPECT_EQ(check_memory(c, static_cast<std::int64_t>(0.5 * need0)).size(), 1U);
}

TEST(ConfigValidate, StragglerSettings) {
  Config c;
  c.training.straggler_interval = 0;  // off
  EXPECT_TRUE(check_config(c, 1).empty());
  c.training.straggler_interval = -1;
  c.training.straggler_threshold = 0.0;
  const std::string text = format_config_issues(c.source, check_config(c, 1));
  EXPECT_NE(text.find("training.straggler_interval = -1"), std::string::npos) << text;
  EXPECT_NE(text.find("training.straggler_threshold = 0"), std::string::npos) << text;
}

TEST(ConfigCheck, ResilienceSettingsAreRejectedWithTheirRule) {
  Config c;
  c.checkpoint.interval = 100;
  c.checkpoint.keep_last = 1;
  c.parallel.comm_timeout_s = 0.5;
  c.parallel.flight_recorder_size = 1;
  EXPECT_TRUE(check_config(c, 1).empty());
  c.checkpoint.interval = -5;
  c.checkpoint.keep_last = 0;
  c.parallel.comm_timeout_s = 0.0;
  c.parallel.flight_recorder_size = 0;
  const std::string text = format_config_issues(c.source, check_config(c, 1));
  EXPECT_NE(text.find("checkpoint.interval = -5"), std::string::npos) << text;
  EXPECT_NE(text.find("checkpoint.keep_last = 0"), std::string::npos) << text;
  EXPECT_NE(text.find("parallel.comm_timeout_s = 0"), std::string::npos) << text;
  EXPECT_NE(text.find("parallel.flight_recorder_size = 0"), std::string::npos) << text;
  c = Config{};
  c.parallel.comm_timeout_s = 1e9;  // more than a day: a typo, not a timeout
  EXPECT_FALSE(check_config(c, 1).empty());
  c = Config{};
  c.checkpoint.resume = "auto";
  c.checkpoint.init_from = "hf/model.safetensors";
  const std::string both = format_config_issues(c.source, check_config(c, 1));
  EXPECT_NE(both.find("cannot be combined with checkpoint.resume"), std::string::npos) << both;
}

}  // namespace
}  // namespace meshtrain

// The named settings are scoped enums parsed when loaded: an unknown name, in TOML or on the
// command line, is a ConfigError naming the setting and its value, listing the allowed names,
// and giving a fix; a known name loads, and to_toml writes the name back.
namespace meshtrain {
namespace {

struct EnumSetting {
  const char* section;
  const char* name;
  const char* bad;
  std::vector<std::string> allowed;
};

TEST(ConfigLoad, BadEnumNamesAreConfigErrorsListingTheAllowedNames) {
  const EnumSetting settings[] = {
      {"model", "family", "bert", {"gpt2", "llama"}},
      {"training", "precision", "fp8", {"fp32", "bf16", "fp16"}},
      {"training", "recompute", "attention", {"none", "selective", "full"}},
      {"training", "lr_scaling", "cubic", {"none", "linear", "sqrt"}},
      {"parallel", "cp_comm", "ring", {"p2p", "a2a"}},
      {"parallel", "pp_schedule", "pipedream", {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"}},
      {"data", "format", "megatron", {"meshtrain", "nanogpt", "llmc"}},
      {"data", "sampler", "sequential", {"random", "epoch"}},
  };
  for (const EnumSetting& s : settings) {
    const std::string key = fmt::format("{}.{}", s.section, s.name);
    SCOPED_TRACE(key);
    const std::string from_toml =
        load_error(fmt::format("[{}]\n{} = \"{}\"\n", s.section, s.name, s.bad));
    const std::string from_cli = load_error("", {{key, s.bad}});
    EXPECT_TRUE(has(from_toml, fmt::format("{} = '{}'", key, s.bad))) << from_toml;
    EXPECT_TRUE(has(from_cli, fmt::format("{} = {}", key, s.bad))) << from_cli;
    for (const std::string& text : {from_toml, from_cli}) {
      EXPECT_TRUE(has(text, "must be one of: ")) << text;
      for (const std::string& name : s.allowed) EXPECT_TRUE(has(text, name + " (")) << text;
    }
    EXPECT_TRUE(has(from_toml, fmt::format("fix:  set {} = \"", key))) << from_toml;
    EXPECT_TRUE(has(from_cli, fmt::format("fix:  pass --{} ", key))) << from_cli;
    // A number instead of a name is as wrong.
    EXPECT_TRUE(
        has(load_error(fmt::format("[{}]\n{} = 3\n", s.section, s.name)), "must be one of: "));
    // Every allowed name loads, and to_toml writes it back as the same string.
    for (const std::string& name : s.allowed) {
      const Config c = load_config_text("", "t.toml", {{key, name}});
      EXPECT_TRUE(has(to_toml(c), fmt::format("{} = \"{}\"", s.name, name))) << name;
      EXPECT_NO_THROW(load_config_text(to_toml(c), "round trip"));
    }
  }
}

TEST(ConfigValidate, DataFileNamesStayInsideDataDirAndForeignFormatsNeedAVocabulary) {
  Config c;
  EXPECT_EQ(c.data.format, DataFormat::meshtrain);
  EXPECT_EQ(c.data.train_file, "train.bin");
  EXPECT_EQ(c.data.val_file, "val.bin");
  EXPECT_EQ(c.data.sampler, DataSampler::random);
  for (const DataFormat format : {DataFormat::nanogpt, DataFormat::llmc}) {
    c.data.format = format;
    const std::string text = issues_text(c, 1);
    EXPECT_TRUE(has(text, "model.vocab_size = 0")) << text;
    EXPECT_TRUE(has(text, fmt::format("must be > 0 with data.format = \"{}\"", to_string(format))))
        << text;
    EXPECT_TRUE(has(text, "or model.vocab_size to the tokenizer's vocabulary")) << text;
    c.model.vocab_size = 50257;
    EXPECT_TRUE(check_config(c, 1).empty()) << issues_text(c, 1);
    c.model.vocab_size = 0;
  }
  c.data.format = DataFormat::meshtrain;  // meta.json gives the vocabulary
  EXPECT_TRUE(check_config(c, 1).empty());

  for (const std::string bad : {"", "../train.bin", "sub/train.bin", "/etc/passwd", ".", ".."}) {
    Config d;
    d.data.val_file = bad;
    const std::string text = issues_text(d, 1);
    EXPECT_TRUE(has(text, fmt::format("data.val_file = \"{}\"", bad))) << text;
    EXPECT_TRUE(has(text, "must be a file name inside data.dir")) << text;
    EXPECT_TRUE(has(text, "fix:  set data.val_file = \"val.bin\"")) << text;
  }
  // The settings load from TOML and from the command line.
  const Config loaded = load_config_text(
      "[data]\nformat = \"llmc\"\ntrain_file = \"tiny_shakespeare_train.bin\"\n", "t.toml",
      {{"data.val_file", "tiny_shakespeare_val.bin"}, {"data.sampler", "epoch"}});
  EXPECT_EQ(loaded.data.format, DataFormat::llmc);
  EXPECT_EQ(loaded.data.train_file, "tiny_shakespeare_train.bin");
  EXPECT_EQ(loaded.data.val_file, "tiny_shakespeare_val.bin");
  EXPECT_EQ(loaded.data.sampler, DataSampler::epoch);
}

TEST(ConfigValidate, DataTokenizerGivesForeignFormatsTheirVocabularyCharIsRefused) {
  Config c;
  EXPECT_EQ(c.data.tokenizer, "");
  c.data.format = DataFormat::nanogpt;
  EXPECT_TRUE(has(issues_text(c, 1), "fix:  set data.tokenizer = \"gpt2\"")) << issues_text(c, 1);
  c.data.tokenizer = "gpt2";  // the vocabulary comes from it: model.vocab_size may stay 0
  EXPECT_TRUE(check_config(c, 1).empty()) << issues_text(c, 1);
  for (const DataFormat format : {DataFormat::meshtrain, DataFormat::llmc}) {
    c.data.format = format;
    c.data.tokenizer = "char";  // a corpus's bytes: only a meta.json knows them
    const std::string text = issues_text(c, 1);
    EXPECT_TRUE(has(text, "data.tokenizer = \"char\"")) << text;
    EXPECT_TRUE(has(text, "the char vocabulary is made from a corpus")) << text;
    EXPECT_TRUE(has(text, "fix:  set data.tokenizer = \"\"")) << text;
  }
  const Config loaded = load_config_text("[data]\nformat = \"nanogpt\"\ntokenizer = \"gpt2\"\n",
                                         "t.toml", {{"data.tokenizer", "runs/sp/tokenizer.model"}});
  EXPECT_EQ(loaded.data.tokenizer, "runs/sp/tokenizer.model");
  EXPECT_EQ(load_config_text(to_toml(loaded), "round trip").data.tokenizer,
            "runs/sp/tokenizer.model");
}

TEST(ConfigEnums, NamesRoundTripAndJsonWritesTheName) {
  EXPECT_EQ(to_string(PipelineSchedule::one_f_one_b), "1f1b");
  EXPECT_EQ(parse_enum<PipelineSchedule>("interleaved_1f1b"), PipelineSchedule::interleaved_1f1b);
  EXPECT_EQ(parse_enum<Precision>("BF16"), std::nullopt);  // names are exact
  for (const auto& [value, name, what] : kCpCommModeNames) {
    EXPECT_EQ(parse_enum<CpCommMode>(to_string(value)), value) << name;
  }
  // Checkpoint metadata and metrics put these into JSON: the name, never the number.
  const nlohmann::json j = {{"pp_schedule", PipelineSchedule::zb_h1},
                            {"precision", Precision::bf16}};
  EXPECT_EQ(j.dump(), R"({"pp_schedule":"zb_h1","precision":"bf16"})");
  EXPECT_EQ(j.at("pp_schedule").get<PipelineSchedule>(), PipelineSchedule::zb_h1);
  EXPECT_THROW(nlohmann::json("zb_h2").get<PipelineSchedule>(), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
