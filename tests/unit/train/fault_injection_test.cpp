// [fault_injection] (docs/resilience.md, "Fault injection"): its settings load from TOML and
// the command line and every rule names the setting, its value, the rule and a fix; a
// checkpoint stores them at their defaults; the injector (train/fault_injector.h) fires on the
// configured rank and step only, on a job's first attempt only; a killed rank dies of SIGKILL
// and a hung one keeps running.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/restart_count.h"
#include "meshtrain/train/fault_injector.h"

namespace meshtrain {
namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string issues_text(const Config& c, int world) {
  return format_config_issues(c.source, check_config(c, world));
}

// The rendered ConfigError of loading the defaults with `overrides` ("" when they load).
std::string load_error(const std::vector<Override>& overrides) {
  try {
    load_config_text("", "t.toml", overrides);
  } catch (const ConfigError& e) {
    return format_config_issues("t.toml", e.issues());
  }
  return "";
}

TEST(FaultInjectionConfig, OffByDefaultAndLoadsFromTomlAndTheCommandLine) {
  const Config defaults;
  const FaultInjectionConfig& d = defaults.fault_injection;
  EXPECT_EQ(d.nonfinite_grad_step, -1);
  EXPECT_EQ(d.slow_rank, -1);
  EXPECT_EQ(d.kill_step, -1);
  EXPECT_EQ(d.hang_step, -1);
  EXPECT_TRUE(check_config(defaults, 1).empty()) << issues_text(defaults, 1);

  const Config c = load_config_text(
      "[fault_injection]\nkill_step = 7\nkill_rank = 1\nnonfinite_grad_value = \"nan\"\n", "t.toml",
      {{"fault_injection.slow_rank", "1"},
       {"fault_injection.slow_phase", "forward"},
       {"fault_injection.slow_seconds", "0.25"},
       {"fault_injection.hang_step", "9"},
       {"parallel.dp", "2"}});
  const FaultInjectionConfig& f = c.fault_injection;
  EXPECT_EQ(f.kill_step, 7);
  EXPECT_EQ(f.kill_rank, 1);
  EXPECT_EQ(f.nonfinite_grad_value, FaultValue::nan);
  EXPECT_EQ(f.slow_rank, 1);
  EXPECT_EQ(f.slow_phase, FaultPhase::forward);
  EXPECT_EQ(f.slow_seconds, 0.25);
  EXPECT_EQ(f.hang_step, 9);
  EXPECT_TRUE(check_config(c, 2).empty()) << issues_text(c, 2);
  EXPECT_EQ(to_toml(load_config_text(to_toml(c), "round trip")), to_toml(c));
}

TEST(FaultInjectionConfig, EveryRuleNamesTheSettingValueRuleAndFix) {
  struct Case {
    const char* key;
    const char* value;
    const char* rule;
    const char* fix;
  };
  // A 2-rank job of 20 steps.
  const Case cases[] = {
      {"nonfinite_grad_step", "0",
       "must be -1 (never) or a step of the run, 1 … training.max_steps = 20",
       "use -1, or e.g. 10"},
      {"nonfinite_grad_step", "21", "1 … training.max_steps = 20", "use -1, or e.g. 10"},
      {"nonfinite_grad_rank", "2", "must be a world rank, 0 … 1", "use a rank below the 2"},
      {"kill_step", "-2", "must be -1 (never) or a step of the run", "use -1"},
      {"kill_rank", "-1", "must be a world rank, 0 … 1", "use a rank below the 2"},
      {"hang_step", "25", "must be -1 (never) or a step of the run", "use -1"},
      {"hang_rank", "5", "must be a world rank, 0 … 1", "use a rank below the 2"},
      {"slow_rank", "2", "must be -1 (none) or a world rank, 0 … 1", "use -1, or a rank"},
      {"slow_rank", "-3", "must be -1 (none) or a world rank", "use -1, or a rank"},
      {"slow_seconds", "-0.5", "must lie in [0, 86400] seconds", "use e.g. 0.05"},
      {"slow_seconds", "86401", "must lie in [0, 86400] seconds", "use e.g. 0.05"},
  };
  for (const Case& k : cases) {
    const std::string key = fmt::format("fault_injection.{}", k.key);
    SCOPED_TRACE(fmt::format("{} = {}", key, k.value));
    // Every fault on (a rank is checked only when its fault is), then the bad setting.
    const Config c = load_config_text("", "t.toml",
                                      {{"training.max_steps", "20"},
                                       {"parallel.dp", "2"},
                                       {"fault_injection.nonfinite_grad_step", "5"},
                                       {"fault_injection.kill_step", "5"},
                                       {"fault_injection.hang_step", "6"},
                                       {key, k.value}});
    const std::string text = issues_text(c, 2);
    EXPECT_TRUE(has(text, fmt::format("{} = {}", key, k.value))) << text;
    EXPECT_TRUE(has(text, k.rule)) << text;
    EXPECT_TRUE(has(text, fmt::format("fix:  {}", k.fix))) << text;
    EXPECT_EQ(check_config(c, 2).size(), 1U) << text;
  }
  // A rank is not checked while its fault is off (the planner checks every world size).
  Config off;
  off.fault_injection.kill_rank = 7;
  EXPECT_TRUE(check_config(off, 1).empty()) << issues_text(off, 1);
  // inf and NaN: refused when loaded, and by the rule for a Config built in code.
  EXPECT_TRUE(
      has(load_error({{"fault_injection.slow_seconds", "inf"}}), "must be a finite number"));
  for (const double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    Config c;
    c.fault_injection.slow_seconds = bad;
    EXPECT_TRUE(has(issues_text(c, 1), "must lie in [0, 86400] seconds")) << issues_text(c, 1);
  }
  // A hung rank needs a peer whose watchdog notices it.
  Config alone;
  alone.fault_injection.hang_step = 3;
  const std::string text = issues_text(alone, 1);
  EXPECT_TRUE(has(text, "fault_injection.hang_step = 3")) << text;
  EXPECT_TRUE(has(text, "needs a job of 2 or more ranks")) << text;
  // Unknown names are load errors listing the known ones.
  EXPECT_TRUE(has(load_error({{"fault_injection.nonfinite_grad_value", "infinity"}}),
                  "must be one of: inf ("));
  EXPECT_TRUE(
      has(load_error({{"fault_injection.slow_phase", "optimizer"}}), "must be one of: forward ("));
}

// A checkpoint stores the faults at their defaults: resuming or resharding it onto another
// world never replays a rehearsal, nor refuses a rank that the new world lacks.
TEST(FaultInjectionConfig, ACheckpointStoresNoFaults) {
  Config c;
  c.fault_injection.kill_step = 5;
  c.fault_injection.kill_rank = 3;
  c.fault_injection.slow_rank = 3;
  c.fault_injection.slow_seconds = 1.0;
  EXPECT_TRUE(has(to_toml(c), "kill_step = 5"));  // the run's own log records them
  const Config stored = load_config_text(checkpoint_toml(c), "checkpoint");
  EXPECT_EQ(stored.fault_injection.kill_step, -1);
  EXPECT_EQ(stored.fault_injection.slow_rank, -1);
  EXPECT_TRUE(check_config(stored, 1).empty()) << issues_text(stored, 1);
  c.fault_injection = {};
  EXPECT_EQ(checkpoint_toml(c), to_toml(c));  // and nothing else changes
}

FaultInjectionConfig every_fault() {
  FaultInjectionConfig f;
  f.nonfinite_grad_step = 3;
  f.nonfinite_grad_rank = 1;
  f.slow_rank = 1;
  f.slow_phase = FaultPhase::backward;
  f.slow_seconds = 0.5;
  f.kill_step = 4;
  f.kill_rank = 2;
  f.hang_step = 6;
  f.hang_rank = 0;
  return f;
}

TEST(FaultInjector, FiresOnTheConfiguredRankAndStepOnly) {
  const FaultInjectionConfig f = every_fault();
  using StepFault = FaultInjector::StepFault;
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(fmt::format("rank {}", rank));
    const FaultInjector faults(f, rank, /*restart_count=*/0);
    for (std::int64_t step = 1; step <= 8; ++step) {
      const StepFault expected = rank == 2 && step == 4   ? StepFault::kill
                                 : rank == 0 && step == 6 ? StepFault::hang
                                                          : StepFault::none;
      EXPECT_EQ(faults.step_fault(step), expected) << "step " << step;
      EXPECT_EQ(faults.nonfinite_grad(step).has_value(), rank == 1 && step == 3) << step;
    }
    EXPECT_EQ(faults.phase_delay_s(Phase::backward), rank == 1 ? 0.5 : 0.0);
    EXPECT_EQ(faults.phase_delay_s(Phase::forward), 0.0);
  }
  // The value: inf, or a NaN.
  EXPECT_EQ(*FaultInjector(f, 1, 0).nonfinite_grad(3), std::numeric_limits<float>::infinity());
  FaultInjectionConfig nan = f;
  nan.nonfinite_grad_value = FaultValue::nan;
  EXPECT_TRUE(std::isnan(*FaultInjector(nan, 1, 0).nonfinite_grad(3)));
}

TEST(FaultInjector, WritesTheGradientElementOnlyWhereItFires) {
  const FaultInjector faults(every_fault(), 1, 0);
  std::vector<float> grad{0.5f, 0.25f};
  faults.after_grad_reduction(2, grad);
  EXPECT_EQ(grad[0], 0.5f);
  faults.after_grad_reduction(3, grad);
  EXPECT_EQ(grad[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(grad[1], 0.25f);
  faults.after_grad_reduction(3, std::span<float>());  // a rank without gradients: no crash
  const FaultInjector other_rank(every_fault(), 0, 0);
  std::vector<float> untouched{1.0f};
  other_rank.after_grad_reduction(3, untouched);
  EXPECT_EQ(untouched[0], 1.0f);
}

// A restarted job recovers: no fault fires on any rank after a restart.
TEST(FaultInjector, InjectsNothingAfterARestart) {
  for (int rank = 0; rank < 4; ++rank) {
    const FaultInjector faults(every_fault(), rank, /*restart_count=*/1);
    for (std::int64_t step = 1; step <= 8; ++step) {
      EXPECT_EQ(faults.step_fault(step), FaultInjector::StepFault::none);
      EXPECT_FALSE(faults.nonfinite_grad(step).has_value());
    }
    EXPECT_EQ(faults.phase_delay_s(Phase::backward), 0.0);
  }
}

// Sets an environment variable for the scope of one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(RestartCount, ReadsMeshtrainLaunchAndSlurmCountsZeroWhenAbsentOrGarbage) {
  ScopedEnv launch(kRestartCountEnv, nullptr);
  ScopedEnv slurm("SLURM_RESTART_COUNT", nullptr);
  EXPECT_EQ(restart_count_from_env(), 0);
  ::setenv(kRestartCountEnv, "0", 1);
  EXPECT_EQ(restart_count_from_env(), 0);
  ::setenv(kRestartCountEnv, "2", 1);
  EXPECT_EQ(restart_count_from_env(), 2);
  ::setenv("SLURM_RESTART_COUNT", "3", 1);
  EXPECT_EQ(restart_count_from_env(), 3);  // the larger
  for (const char* garbage : {"", "x", "1x", "-4"}) {
    ::setenv(kRestartCountEnv, garbage, 1);
    ::setenv("SLURM_RESTART_COUNT", garbage, 1);
    EXPECT_EQ(restart_count_from_env(), 0) << "'" << garbage << "'";
  }
}

TEST(FaultInjectorDeathTest, AKilledRankDiesOfSigkillAtItsStepOnly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const FaultInjector faults(every_fault(), 2, 0);
  faults.at_step_start(3);  // not its step: returns
  EXPECT_EXIT(faults.at_step_start(4), ::testing::KilledBySignal(SIGKILL),
              "fault_injection: rank 2 raises SIGKILL on itself at the start of step 4");
}

// A hung rank neither returns nor exits: after 300 ms the child is still running (then killed).
TEST(FaultInjector, AHungRankKeepsRunningAtItsStep) {
  const FaultInjector faults(every_fault(), 0, 0);
  faults.at_step_start(5);  // not its step: returns
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    faults.at_step_start(6);
    ::_exit(0);  // reached only when the hang returned
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, WNOHANG), 0) << "the hung rank ended";
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
}

}  // namespace
}  // namespace meshtrain
