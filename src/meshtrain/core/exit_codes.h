// src/meshtrain/core/exit_codes.h — what `meshtrain`'s exit status means (docs/resilience.md,
// "Exit codes"). `meshtrain launch` reads them to decide whether a restart can help.
//
//   0  success
//   1  runtime error (a peer failed, a diverged loss, out of memory) — a restart may help
//   2  bad configuration or arguments (every problem listed before any allocation)
//   3  a missing or corrupt data or checkpoint file (named in the message)
//   4  the watchdog ended a hung job (kWatchdogExitCode, monitor/watchdog.h)
//   5  stopped by SIGTERM, SIGUSR1 or SIGINT: every rank finished the same step and a complete
//      checkpoint of it was written (unless checkpoint.save_final = false and
//      checkpoint.interval = 0); `--checkpoint.resume auto` continues from it
#pragma once

namespace meshtrain {

inline constexpr int kExitStoppedBySignal = 5;

}  // namespace meshtrain
