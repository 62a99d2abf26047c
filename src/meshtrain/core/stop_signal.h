// src/meshtrain/core/stop_signal.h — the signals that ask a training job to stop cleanly
// (preemption: Slurm sends SIGTERM, or the signal of `--signal`; docs/resilience.md,
// "Preemption"). A thread of its own records the signal; the trainer looks at it between steps
// and the ranks agree on the step to stop after (Trainer::run).
#pragma once

#include <string>

namespace meshtrain {

/// Makes SIGTERM, SIGUSR1 and SIGINT stop requests: they are blocked in the calling thread
/// (so in every thread it starts afterwards) and taken by a thread of their own (sigwait),
/// which records the first of them and does nothing else, so the process goes on until it reads
/// stop_signal_received(); no other thread is ever interrupted by one. A second SIGINT ends the
/// process at once (killed by SIGINT). SIGTERM and SIGUSR1 stay caught (a rank may get both:
/// Slurm's SIGTERM and the SIGUSR1 `meshtrain launch` forwards); a rank that must die now gets
/// SIGKILL. A signal sent to the process (kill, Slurm, mpirun) is taken; one sent to another
/// thread of it (pthread_kill, raise from that thread) waits, blocked, forever. Call once per
/// process, before any other thread starts.
void install_stop_signal_handlers();

/// The first of SIGTERM, SIGUSR1, SIGINT received since install_stop_signal_handlers(); 0 when
/// none. Safe from any thread. Taken asynchronously: a signal just sent shows a moment later.
int stop_signal_received() noexcept;

/// How many stop signals were received so far (every one, not only the first).
int stop_signals_received() noexcept;

/// "SIGTERM", "SIGUSR1", … ("signal N" for a number without a name).
std::string signal_name(int sig);

}  // namespace meshtrain
