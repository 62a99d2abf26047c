// src/meshtrain/launch/launch_plan.h
//
// The pure parts of `meshtrain launch` (docs/resilience.md, "Launcher"): the mpirun command
// line of each attempt, what mpirun's output says about the rank that failed, and whether a
// failed attempt is worth restarting. No processes, no MPI: apps/launch_command.cpp and
// launch/supervisor.h run what these functions decide, and tests/unit/launch/launch_test.cpp
// checks them on strings.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

struct LaunchPlan {
  int ranks = 1;                         // mpirun -np
  int cores = 1;                         // online CPUs; more ranks than this oversubscribe
  std::string mpirun = "mpirun";         // resolved path of mpirun
  std::vector<std::string> mpirun_args;  // extra arguments, placed before the program
  std::string program;                   // this meshtrain executable (/proc/self/exe)
  std::vector<std::string> command;      // after `--`: train <config> [overrides...]
};

/// `command` with every `--checkpoint.resume X` / `--checkpoint.resume=X` removed and
/// `--checkpoint.resume auto` appended: what a restart runs, so that it continues from the
/// newest complete checkpoint whatever the first attempt was told.
std::vector<std::string> with_resume_auto(const std::vector<std::string>& command);

/// The whole argv of the attempt after `restarts_done` restarts: mpirun -np N
/// [--oversubscribe --bind-to none when N > cores] -x MESHTRAIN_RESTART_COUNT=<restarts_done>
/// <mpirun_args...> <program> <command...>; a restart (restarts_done > 0) runs
/// with_resume_auto(command). OpenMPI's -x exports the count to every rank, on every host
/// (core/restart_count.h; the fault injector reads it).
std::vector<std::string> mpirun_argv(const LaunchPlan& plan, int restarts_done);

/// Splits --mpirun-args on blanks; single or double quotes keep blanks inside one argument.
/// Returns std::nullopt when a quote is not closed.
std::optional<std::vector<std::string>> split_arguments(std::string_view text);

/// What mpirun's output told about the first process that failed.
struct FailedRank {
  std::optional<int> rank;       // MPI_COMM_WORLD rank, when mpirun named it
  std::optional<int> signal;     // it died of this signal ...
  std::string signal_name;       // ... which mpirun calls this ("Killed")
  std::optional<int> exit_code;  // or it returned this non-zero exit code
  bool launch_failed = false;    // mpirun could not start the program at all
  bool watchdog = false;         // a rank printed "[watchdog] ending the job" (it exits 4)
};

/// Reads mpirun's output as it streams by (chunks split anywhere) and keeps what its
/// messages say about the failure:
///   "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
///   "  Process name: [[12096,1],0]" followed by "  Exit code:    2"
///   "mpirun was unable to launch the specified application ..."
///   "[watchdog] ending the job (exit code 4)" (a rank's own line, monitor/watchdog.h)
/// The first rank named wins: later ones are usually victims of the teardown.
class MpirunOutputScanner {
 public:
  void feed(std::string_view chunk);
  void finish();  // a last line without a newline
  const FailedRank& failed() const noexcept { return failed_; }

 private:
  void scan_line(std::string_view line);

  std::string partial_;
  std::optional<int> pending_rank_;  // from "Process name:", waiting for "Exit code:"
  FailedRank failed_;
};

/// How one attempt (the mpirun process) ended, as waitpid reported it.
struct AttemptStatus {
  bool signaled = false;  // mpirun itself was killed by `code`
  int code = 0;           // exit status, or signal number when signaled

  /// The exit code a shell would report: the status, or 128 + signal.
  int shell_code() const noexcept { return signaled ? 128 + code : code; }
};

/// One clause saying why the attempt failed, e.g. "rank 1 exited on signal 9 (Killed)",
/// "rank 0 exited with code 3", "mpirun exited with code 1".
std::string describe_failure(const AttemptStatus& status, const FailedRank& failed);

struct RetryDecision {
  bool restart = false;
  std::string reason;  // why not, when restart is false
};

/// Whether to run the job again after a failed attempt. Never after success, an interrupt the
/// launcher forwarded, exit code 2 (bad configuration or arguments) or 3 (bad data file),
/// or a program mpirun could not start: a restart cannot fix those. Nor after exit code 5
/// (kExitStoppedBySignal: the ranks were asked to stop and checkpointed), with or without an
/// interrupt of the launcher. Otherwise while restarts_done < max_restarts.
RetryDecision decide_retry(const AttemptStatus& status, const FailedRank& failed, bool interrupted,
                           int restarts_done, int max_restarts);

}  // namespace meshtrain
