// src/meshtrain/launch/supervisor.h
//
// Runs a job's mpirun as a child process and restarts it after a failure (docs/resilience.md,
// "Launcher"). POSIX processes only: the launcher never initialises MPI, so it outlives the
// ranks it supervises. What to run and whether to restart come from launch/launch_plan.h.
#pragma once

#include <cstdio>

#include "meshtrain/launch/launch_plan.h"

namespace meshtrain {

struct SupervisorIo {
  int out_fd = 1;           // mpirun's stdout is copied here ...
  int err_fd = 2;           // ... and its stderr here, as it arrives
  std::FILE* log = stderr;  // the launcher's own lines, "meshtrain launch: ..."
};

/// How long to wait for a failing job, and between attempts (docs/resilience.md, "Launcher").
struct SupervisorPolicy {
  // Seconds mpirun may take to exit once a rank failed (mpirun named the rank, or a rank
  // printed its watchdog's "ending the job"); then the launcher kills mpirun's process group
  // (SIGKILL). OpenMPI's own teardown takes ≈2 s; with a host unreachable it can hang for
  // minutes in "abort is already in progress".
  double grace_s = 15;
  // Seconds before restart k: restart_delay_s · 2^(k−1), at most kMaxRestartDelayS, so
  // attempts that fail fast while a link or host is down are spread over ≈2× the last delay.
  double restart_delay_s = 1;
};
inline constexpr double kMaxRestartDelayS = 60;

/// Runs mpirun_argv(plan, restarts done) until it exits 0, fails in a way a restart cannot fix, or
/// max_restarts restarts are used. Each attempt runs in its own session with stdin from
/// /dev/null. SIGINT, SIGTERM, SIGHUP and SIGUSR1 sent to the launcher end the restarts: the
/// first is passed to mpirun as SIGUSR1 (the ranks checkpoint and stop, exit code 5), a second
/// as SIGTERM (mpirun ends the job); the launcher then waits for mpirun to exit. After every
/// attempt, any process of its session that outlived mpirun is killed (SIGKILL) and reaped,
/// so the next attempt starts alone. Returns the last attempt's exit code (128 + signal when
/// mpirun itself died of a signal), or 1 when mpirun could not be started. A signal during
/// the wait before a restart ends the restarts too.
int supervise(const LaunchPlan& plan, int max_restarts, const SupervisorIo& io = {},
              const SupervisorPolicy& policy = {});

}  // namespace meshtrain
