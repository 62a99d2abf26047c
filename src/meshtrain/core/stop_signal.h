// src/meshtrain/core/stop_signal.h — the signals that ask a training job to stop cleanly
// (preemption: Slurm sends SIGTERM, or the signal of `--signal`; docs/resilience.md,
// "Preemption"). The handler only records the signal; the trainer looks at it between steps
// and the ranks agree on the step to stop after (Trainer::run).
#pragma once

#include <string>

namespace meshtrain {

/// Installs the handler for SIGTERM, SIGUSR1 and SIGINT. It records the first of them received
/// (async-signal-safe: one lock-free atomic store) and does nothing else, so the process goes
/// on until it reads stop_signal_received(). SIGINT's handler is reset when it fires
/// (SA_RESETHAND): a second Ctrl-C ends the process at once. SIGTERM and SIGUSR1 stay caught
/// (a rank may get both: Slurm's SIGTERM and the SIGUSR1 `meshtrain launch` forwards); a rank
/// that must die now gets SIGKILL. Call once per process, before threads start.
void install_stop_signal_handlers();

/// The first of SIGTERM, SIGUSR1, SIGINT received since install_stop_signal_handlers(); 0 when
/// none. Safe from any thread.
int stop_signal_received() noexcept;

/// "SIGTERM", "SIGUSR1", … ("signal N" for a number without a name).
std::string signal_name(int sig);

}  // namespace meshtrain
