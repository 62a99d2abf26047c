// meshtrain launch (launch/launch_plan.h, launch/supervisor.h): the mpirun command of each
// attempt, what mpirun's messages say about the failed rank, the retry policy, and the
// supervision loop itself driven by a fake mpirun (a shell script) — no MPI needed.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/launch/launch_plan.h"
#include "meshtrain/launch/supervisor.h"

namespace meshtrain {
namespace {

using Args = std::vector<std::string>;

TEST(LaunchPlan, RestartAppendsResumeAuto) {
  EXPECT_EQ(with_resume_auto({"train", "c.toml", "--training.max_steps", "40"}),
            (Args{"train", "c.toml", "--training.max_steps", "40", "--checkpoint.resume", "auto"}));
}

TEST(LaunchPlan, RestartReplacesAnExplicitResume) {
  EXPECT_EQ(
      with_resume_auto({"train", "c.toml", "--checkpoint.resume", "runs/x/step-10", "--a", "1"}),
      (Args{"train", "c.toml", "--a", "1", "--checkpoint.resume", "auto"}));
  EXPECT_EQ(with_resume_auto({"train", "c.toml", "--checkpoint.resume=", "--checkpoint.resume=d"}),
            (Args{"train", "c.toml", "--checkpoint.resume", "auto"}));
  // A key that only starts like it is left alone.
  EXPECT_EQ(with_resume_auto({"train", "c.toml", "--checkpoint.resume_x", "1"}),
            (Args{"train", "c.toml", "--checkpoint.resume_x", "1", "--checkpoint.resume", "auto"}));
}

TEST(LaunchPlan, MpirunArgvOversubscribesOnlyBeyondTheCoresAndExportsTheRestartCount) {
  LaunchPlan plan = {.ranks = 2,
                     .cores = 2,
                     .mpirun = "/usr/bin/mpirun",
                     .mpirun_args = {"-x", "FOO"},
                     .program = "/opt/meshtrain",
                     .command = {"train", "c.toml", "--checkpoint.resume", "d"}};
  EXPECT_EQ(mpirun_argv(plan, 0),
            (Args{"/usr/bin/mpirun", "-np", "2", "-x", "MESHTRAIN_RESTART_COUNT=0", "-x", "FOO",
                  "/opt/meshtrain", "train", "c.toml", "--checkpoint.resume", "d"}));
  plan.ranks = 4;
  // A restart resumes, and its ranks learn which restart it is (the fault injector's rule).
  EXPECT_EQ(mpirun_argv(plan, 2),
            (Args{"/usr/bin/mpirun", "-np", "4", "--oversubscribe", "--bind-to", "none", "-x",
                  "MESHTRAIN_RESTART_COUNT=2", "-x", "FOO", "/opt/meshtrain", "train", "c.toml",
                  "--checkpoint.resume", "auto"}));
}

TEST(LaunchPlan, SplitArgumentsKeepsQuotedBlanks) {
  EXPECT_EQ(split_arguments("  --bind-to none  -x 'A=1 2' \"\" "),
            (Args{"--bind-to", "none", "-x", "A=1 2", ""}));
  EXPECT_EQ(split_arguments(""), Args{});
  EXPECT_FALSE(split_arguments("-x 'open"));
}

// OpenMPI 4.1's messages, as captured on this machine (kill -9 of rank 1; rank 1 exit 3).
constexpr std::string_view kKilled =
    "--------------------------------------------------------------------------\n"
    "Primary job  terminated normally, but 1 process returned\n"
    "a non-zero exit code. Per user-direction, the job has been aborted.\n"
    "--------------------------------------------------------------------------\n"
    "--------------------------------------------------------------------------\n"
    "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n"
    "--------------------------------------------------------------------------\n";
constexpr std::string_view kExitCode =
    "--------------------------------------------------------------------------\n"
    "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
    "the job to be terminated. The first process to do so was:\n"
    "\n"
    "  Process name: [[10315,1],1]\n"
    "  Exit code:    3\n"
    "--------------------------------------------------------------------------\n";

TEST(MpirunOutputScanner, FindsTheKilledRankAndSignalInAnyChunking) {
  for (const std::size_t chunk : {std::size_t{1}, std::size_t{7}, kKilled.size()}) {
    SCOPED_TRACE(fmt::format("chunks of {}", chunk));
    MpirunOutputScanner scanner;
    scanner.feed("step    12/40 | loss 2.9 ...\n");
    for (std::size_t at = 0; at < kKilled.size(); at += chunk)
      scanner.feed(kKilled.substr(at, chunk));
    scanner.finish();
    const FailedRank& f = scanner.failed();
    ASSERT_TRUE(f.rank && f.signal);
    EXPECT_EQ(*f.rank, 1);
    EXPECT_EQ(*f.signal, 9);
    EXPECT_EQ(f.signal_name, "Killed");
    EXPECT_FALSE(f.exit_code);
    EXPECT_EQ(describe_failure({.signaled = false, .code = 137}, f),
              "rank 1 exited on signal 9 (Killed)");
  }
}

TEST(MpirunOutputScanner, FindsTheRankAndExitCode) {
  MpirunOutputScanner scanner;
  scanner.feed(kExitCode);
  const FailedRank& f = scanner.failed();
  ASSERT_TRUE(f.rank && f.exit_code);
  EXPECT_EQ(*f.rank, 1);
  EXPECT_EQ(*f.exit_code, 3);
  EXPECT_FALSE(f.signal);
  EXPECT_EQ(describe_failure({.signaled = false, .code = 3}, f), "rank 1 exited with code 3");
}

TEST(MpirunOutputScanner, FirstRankNamedWinsAndLastLineNeedsNoNewline) {
  MpirunOutputScanner scanner;
  scanner.feed(
      "mpirun noticed that process rank 0 with PID 77 on node a exited on signal 11 "
      "(Segmentation fault).\n");
  scanner.feed(
      "mpirun noticed that process rank 3 with PID 78 on node a exited on signal 9 (Killed).");
  scanner.finish();
  EXPECT_EQ(*scanner.failed().rank, 0);
  EXPECT_EQ(scanner.failed().signal_name, "Segmentation fault");

  MpirunOutputScanner unlaunchable;
  unlaunchable.feed("mpirun was unable to launch the specified application as it could not access");
  unlaunchable.finish();
  EXPECT_TRUE(unlaunchable.failed().launch_failed);
}

TEST(MpirunOutputScanner, NothingRecognisedLeavesOnlyMpirunsStatus) {
  MpirunOutputScanner scanner;
  scanner.feed("Exit code: 4\nProcess name: garbage\nrank 1 said hello\n");
  EXPECT_FALSE(scanner.failed().rank);
  EXPECT_EQ(describe_failure({.signaled = false, .code = 1}, scanner.failed()),
            "mpirun exited with code 1");
  EXPECT_EQ(describe_failure({.signaled = true, .code = 9}, scanner.failed()),
            "mpirun was killed by signal 9 (Killed)");
}

FailedRank rank_signaled(int rank, int signal, std::string name) {
  FailedRank f;
  f.rank = rank;
  f.signal = signal;
  f.signal_name = std::move(name);
  return f;
}
FailedRank rank_exited(int rank, int code) {
  FailedRank f;
  f.rank = rank;
  f.exit_code = code;
  return f;
}
FailedRank launch_failure() {
  FailedRank f;
  f.launch_failed = true;
  return f;
}

TEST(RetryPolicy, RestartsUntilTheBudgetIsSpent) {
  const FailedRank killed = rank_signaled(1, 9, "Killed");
  const AttemptStatus status = {.signaled = false, .code = 137};
  EXPECT_TRUE(decide_retry(status, killed, false, 0, 2).restart);
  EXPECT_TRUE(decide_retry(status, killed, false, 1, 2).restart);
  const RetryDecision spent = decide_retry(status, killed, false, 2, 2);
  EXPECT_FALSE(spent.restart);
  EXPECT_EQ(spent.reason, "all 2 restarts used");
  EXPECT_FALSE(decide_retry(status, killed, false, 0, 0).restart);
  // Exit code 1 (a runtime error, e.g. a peer timed out) and mpirun dying of a signal: retried.
  EXPECT_TRUE(decide_retry({.signaled = false, .code = 1}, {}, false, 0, 1).restart);
  EXPECT_TRUE(decide_retry({.signaled = true, .code = 9}, {}, false, 0, 1).restart);
}

TEST(RetryPolicy, ConfigAndDataErrorsSuccessAndInterruptsAreNotRetried) {
  EXPECT_FALSE(decide_retry({.signaled = false, .code = 0}, {}, false, 0, 3).restart);
  const RetryDecision config = decide_retry({.signaled = false, .code = 2}, {}, false, 0, 3);
  EXPECT_FALSE(config.restart);
  EXPECT_NE(config.reason.find("bad configuration"), std::string::npos) << config.reason;
  const RetryDecision data =
      decide_retry({.signaled = false, .code = 3}, rank_exited(1, 3), false, 0, 3);
  EXPECT_FALSE(data.restart);
  EXPECT_NE(data.reason.find("bad data"), std::string::npos) << data.reason;
  // A rank's own code counts, whatever mpirun returns.
  EXPECT_FALSE(
      decide_retry({.signaled = false, .code = 1}, rank_exited(0, 2), false, 0, 3).restart);
  EXPECT_FALSE(decide_retry({.signaled = true, .code = 15}, {}, true, 0, 3).restart);
  EXPECT_FALSE(decide_retry({.signaled = false, .code = 1}, launch_failure(), false, 0, 3).restart);
}

TEST(RetryPolicy, AJobStoppedByASignalIsNotRetried) {
  // Exit code 5: the ranks were asked to stop (preemption) and checkpointed. Not restarted,
  // whether the launcher passed the signal on or a rank was signalled directly.
  for (const bool interrupted : {false, true}) {
    const RetryDecision stopped =
        decide_retry({.signaled = false, .code = 5}, rank_exited(0, 5), interrupted, 0, 3);
    EXPECT_FALSE(stopped.restart);
    EXPECT_NE(stopped.reason.find("exit code 5 means the ranks received a stop signal and "
                                  "stopped after writing a checkpoint"),
              std::string::npos)
        << stopped.reason;
    EXPECT_NE(stopped.reason.find("--checkpoint.resume auto"), std::string::npos);
  }
  EXPECT_FALSE(decide_retry({.signaled = false, .code = 5}, {}, false, 0, 3).restart);
  // A rank killed by a signal is still a crash, whatever mpirun returns.
  EXPECT_TRUE(
      decide_retry({.signaled = false, .code = 5}, rank_signaled(1, 9, "Killed"), false, 0, 3)
          .restart);
}

// The supervision loop against a fake mpirun: a script that logs its arguments and fails the
// way mpirun does for its first `fails` calls.
class FakeMpirun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("meshtrain_launch_test_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The fake prints a line to stdout, then for its first `fails` calls `failure` to stderr and
  // exits with `code`; later calls exit 0.
  std::string write_fake(int fails, std::string_view failure, int code) {
    const std::string path = (dir_ / "mpirun").string();
    std::ofstream(path) << fmt::format(
        "#!/bin/bash\n"
        "n=$(cat '{0}/calls' 2>/dev/null || echo 0); n=$((n + 1)); echo $n > '{0}/calls'\n"
        "echo \"$*\" >> '{0}/argv'\n"
        "echo \"attempt $n\"\n"
        "if [ $n -le {1} ]; then printf '%s' '{2}' >&2; exit {3}; fi\n"
        "exit 0\n",
        dir_.string(), fails, failure, code);
    ::chmod(path.c_str(), 0755);
    return path;
  }

  struct Run {
    int code;
    std::string log;
    std::vector<std::string> argv;  // one line per mpirun call
    std::string out;                // what the launcher passed through to its stdout
  };
  // No wait between attempts unless a test asks for one.
  Run supervise_fake(const std::string& mpirun, int max_restarts,
                     const SupervisorPolicy& policy = {.grace_s = 15, .restart_delay_s = 0}) {
    const LaunchPlan plan = {.ranks = 2,
                             .cores = 2,
                             .mpirun = mpirun,
                             .mpirun_args = {},
                             .program = "/bin/meshtrain",
                             .command = {"train", "c.toml", "--checkpoint.resume", "x"}};
    std::FILE* log = std::tmpfile();
    std::FILE* out = std::tmpfile();
    std::FILE* err = std::tmpfile();
    const int code = supervise(
        plan, max_restarts, {.out_fd = ::fileno(out), .err_fd = ::fileno(err), .log = log}, policy);
    Run run{.code = code, .log = read_all(log), .argv = {}, .out = read_all(out)};
    std::fclose(log);
    std::fclose(out);
    std::fclose(err);
    std::ifstream argv_file(dir_ / "argv");
    for (std::string line; std::getline(argv_file, line);) run.argv.push_back(line);
    return run;
  }

  static std::string read_all(std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string text;
    for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) text += static_cast<char>(c);
    return text;
  }

  std::filesystem::path dir_;
};

TEST_F(FakeMpirun, KilledRankIsRestartedWithResumeAutoAndTheLogSaysWhy) {
  const Run run = supervise_fake(write_fake(1, kKilled, 137), 3);
  EXPECT_EQ(run.code, 0) << run.log;
  ASSERT_EQ(run.argv.size(), 2U) << run.log;
  EXPECT_EQ(run.argv[0],
            "-np 2 -x MESHTRAIN_RESTART_COUNT=0 /bin/meshtrain train c.toml --checkpoint.resume x");
  EXPECT_EQ(
      run.argv[1],
      "-np 2 -x MESHTRAIN_RESTART_COUNT=1 /bin/meshtrain train c.toml --checkpoint.resume auto");
  EXPECT_NE(run.log.find("meshtrain launch: restart 1 of 3: rank 1 exited on signal 9 (Killed) "
                         "after "),
            std::string::npos)
      << run.log;
  EXPECT_NE(run.log.find("resuming from the newest complete checkpoint"), std::string::npos);
  EXPECT_NE(run.log.find("the job finished after 1 restart\n"), std::string::npos) << run.log;
  EXPECT_EQ(run.out, "attempt 1\nattempt 2\n");  // passed through
}

TEST_F(FakeMpirun, GivesUpAfterMaxRestartsWithTheLastExitCode) {
  const Run run = supervise_fake(write_fake(5, kKilled, 137), 2);
  EXPECT_EQ(run.code, 137) << run.log;
  EXPECT_EQ(run.argv.size(), 3U) << run.log;
  EXPECT_NE(run.log.find("restart 2 of 2: rank 1"), std::string::npos) << run.log;
  EXPECT_NE(run.log.find("not restarting: all 2 restarts used (exit code 137)"), std::string::npos)
      << run.log;
}

TEST_F(FakeMpirun, BadDataIsNotRetried) {
  const Run run = supervise_fake(write_fake(1, kExitCode, 3), 3);
  EXPECT_EQ(run.code, 3) << run.log;
  EXPECT_EQ(run.argv.size(), 1U) << run.log;
  EXPECT_NE(run.log.find("rank 1 exited with code 3 after"), std::string::npos) << run.log;
  EXPECT_NE(run.log.find("not restarting: exit code 3 means a bad data file; a restart cannot fix "
                         "it (exit code 3)"),
            std::string::npos)
      << run.log;
}

// SIGTERM to the launcher reaches mpirun as SIGUSR1 (forwarded to the ranks, which checkpoint
// and stop); a second signal as SIGTERM. The fake records what it got and exits 5 on SIGTERM.
TEST_F(FakeMpirun, AStopSignalIsPassedAsSigusr1ThenSigterm) {
  const std::string path = (dir_ / "mpirun").string();
  const std::string got = (dir_ / "got").string();
  std::ofstream(path) << fmt::format(
      "#!/bin/bash\n"
      "echo \"$*\" >> '{0}/argv'\n"
      "trap 'echo USR1 >> {1}' USR1\n"
      "trap 'echo TERM >> {1}; exit 5' TERM\n"
      "touch '{0}/ready'\n"
      "while true; do sleep 0.02; done\n",
      dir_.string(), got);
  ::chmod(path.c_str(), 0755);
  // The launcher's handlers are installed before it starts mpirun, so once the fake is ready
  // a signal to this process goes to them.
  std::thread signaller([&] {
    const auto wait_for = [](const std::filesystem::path& p, const std::string& text) {
      for (int i = 0; i < 500; ++i) {
        std::ifstream in(p);
        const std::string content((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
        if (std::filesystem::exists(p) && content.find(text) != std::string::npos) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return false;
    };
    // Without the fake running (or once it has exited) the signal would hit the default
    // action and end this test binary: signal only while the launcher's handlers are in place.
    if (!wait_for(dir_ / "ready", "")) return;
    ::kill(::getpid(), SIGTERM);
    if (wait_for(got, "USR1")) ::kill(::getpid(), SIGINT);
  });
  const Run run = supervise_fake(path, 3);
  signaller.join();
  EXPECT_EQ(run.code, 5) << run.log;
  EXPECT_EQ(run.argv.size(), 1U) << run.log;  // not restarted
  std::ifstream in(got);
  const std::string received((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  EXPECT_EQ(received, "USR1\nTERM\n");
  EXPECT_NE(run.log.find("got SIGTERM; asking every rank to finish its step, write a checkpoint "
                         "and stop (SIGUSR1 to mpirun)"),
            std::string::npos)
      << run.log;
  EXPECT_NE(run.log.find("got SIGINT again; ending the job now (SIGTERM to mpirun)"),
            std::string::npos)
      << run.log;
  EXPECT_NE(run.log.find("not restarting: exit code 5 means the ranks received a stop signal"),
            std::string::npos)
      << run.log;
}

// After the watchdog's exit 4 with a host unreachable, OpenMPI's mpirun can hang in "abort is
// already in progress" (issue 17 item 7). The fake prints the rank's watchdog line, leaves a
// child in its process group and hangs, ignoring SIGTERM, on its first call: the launcher
// kills the group after the grace and restarts.
TEST_F(FakeMpirun, AStuckMpirunIsKilledAfterTheGraceAndRestarted) {
  const std::string path = (dir_ / "mpirun").string();
  std::ofstream(path) << fmt::format(
      "#!/bin/bash\n"
      "n=$(cat '{0}/calls' 2>/dev/null || echo 0); n=$((n + 1)); echo $n > '{0}/calls'\n"
      "echo \"$*\" >> '{0}/argv'\n"
      "if [ $n -eq 1 ]; then\n"
      "  trap '' TERM\n"
      "  sleep 1000 & echo $! > '{0}/child'\n"
      "  echo '[watchdog] ending the job (exit code 4)' >&2\n"
      "  for i in $(seq 300); do sleep 0.05; done\n"  // ≈15 s: the test ends without the kill

      "fi\n"
      "exit 0\n",
      dir_.string());
  ::chmod(path.c_str(), 0755);
  const auto start = std::chrono::steady_clock::now();
  const Run run = supervise_fake(path, 3, {.grace_s = 1, .restart_delay_s = 0});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.code, 0) << run.log;
  EXPECT_EQ(run.argv.size(), 2U) << run.log;
  EXPECT_NE(run.log.find("mpirun has not exited 1 s (--grace) after a rank's watchdog ended the "
                         "job; killing its process group (SIGKILL)"),
            std::string::npos)
      << run.log;
  EXPECT_NE(run.log.find("restart 1 of 3: a rank's watchdog ended the job (exit code 4: a "
                         "communication operation timed out) after "),
            std::string::npos)
      << run.log;
  EXPECT_NE(run.log.find("(mpirun killed after the grace)"), std::string::npos) << run.log;
  // The grace (1 s) plus the launcher's 200 ms poll and the kill, not the fake's 1000 s.
  EXPECT_GE(seconds, 1.0);
  EXPECT_LT(seconds, 10.0);
  std::ifstream child_file(dir_ / "child");
  pid_t child = 0;
  child_file >> child;
  ASSERT_GT(child, 0);
  EXPECT_NE(::kill(child, 0), 0) << "the stuck mpirun's child " << child << " is still alive";
}

// Attempts that fail fast (a peer's host unreachable) are spread out: restart k waits
// restart_delay_s · 2^(k−1).
TEST_F(FakeMpirun, RestartsWaitLongerEachTime) {
  const auto start = std::chrono::steady_clock::now();
  const Run run =
      supervise_fake(write_fake(3, kKilled, 137), 3, {.grace_s = 15, .restart_delay_s = 0.2});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.code, 0) << run.log;
  EXPECT_EQ(run.argv.size(), 4U) << run.log;
  for (const char* wait : {"restart 1 of 3: rank 1 exited on signal 9 (Killed) after",
                           "complete checkpoint in 0.2 s\n", "complete checkpoint in 0.4 s\n",
                           "complete checkpoint in 0.8 s\n"}) {
    EXPECT_NE(run.log.find(wait), std::string::npos) << wait << "\n" << run.log;
  }
  EXPECT_GE(seconds, 1.4);  // 0.2 + 0.4 + 0.8
}

TEST_F(FakeMpirun, AnUnexecutableMpirunIsReported) {
  const std::string path = (dir_ / "not_executable").string();
  std::ofstream(path) << "x";
  const Run run = supervise_fake(path, 3);
  EXPECT_EQ(run.code, 1);
  EXPECT_NE(run.log.find("cannot run " + path), std::string::npos) << run.log;
}

}  // namespace
}  // namespace meshtrain
