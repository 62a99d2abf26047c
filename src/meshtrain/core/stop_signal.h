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
/// stop_signal_received(); no other thread is interrupted by one. A recording handler is
/// installed too, as a safety net for a thread that unblocks them. A second SIGINT ends the
/// process at once (killed by SIGINT). SIGTERM and SIGUSR1 stay caught (a rank may get both:
/// Slurm's SIGTERM and the SIGUSR1 `meshtrain launch` forwards); a rank that must die now gets
/// SIGKILL. A signal sent to the process (kill, Slurm, mpirun) is taken; one sent to a thread
/// that blocks it (pthread_kill, raise from that thread) stays pending. Child processes inherit
/// the blocked mask: code that forks and execs after this call must unblock the three in the
/// child. Call before any other thread starts; later calls do nothing.
void install_stop_signal_handlers();

/// The first of SIGTERM, SIGUSR1, SIGINT received since install_stop_signal_handlers(); 0 when
/// none. Safe from any thread. Taken asynchronously: a signal just sent shows a moment later.
int stop_signal_received() noexcept;

/// How many stop signals were taken so far (every one, not only the first; a signal sent again
/// while the same one is still pending is merged with it by the kernel and counted once).
int stop_signals_received() noexcept;

/// "SIGTERM", "SIGUSR1", … ("signal N" for a number without a name).
std::string signal_name(int sig);

}  // namespace meshtrain
