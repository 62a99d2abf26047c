#include "meshtrain/core/stop_signal.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace meshtrain {
namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<int> g_stop_signals{0};
std::atomic<int> g_interrupts{0};                      // SIGINTs taken: the second ends the process
static_assert(std::atomic<int>::is_always_lock_free);  // record_stop_signal may run as a handler

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGINT);
  return set;
}

// The second SIGINT: its default action, at once (the process ends killed by SIGINT).
[[noreturn]] void die_of_sigint() {
  struct sigaction action = {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  sigset_t just;
  sigemptyset(&just);
  sigaddset(&just, SIGINT);
  ::pthread_sigmask(SIG_UNBLOCK, &just, nullptr);
  ::raise(SIGINT);
  std::_Exit(128 + SIGINT);  // not reached
}

// Records a stop signal; the second SIGINT ends the process. The signal thread's one action,
// and the safety-net handler's: async-signal-safe (lock-free atomics, sigaction,
// pthread_sigmask, raise).
extern "C" void record_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);  // the first one wins
  g_stop_signals.fetch_add(1);
  if (sig == SIGINT && g_interrupts.fetch_add(1) + 1 == 2) die_of_sigint();
}

// Takes the stop signals one at a time, for the life of the process.
void wait_for_stop_signals(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) continue;
    record_stop_signal(sig);
  }
}

}  // namespace

void install_stop_signal_handlers() {
  static std::once_flag once;  // one signal thread per process, however often this is called
  std::call_once(once, [] {
    const sigset_t set = stop_signals();
    // Blocked here, so in every thread started after this one (MPI's, OpenMP's, the
    // watchdog's): the signals wait for the thread below instead of interrupting a library
    // call in the middle of a step. A stop signal delivered asynchronously to a computing rank
    // was followed, rarely, by glibc aborting on a corrupted heap inside oneDNN's or
    // meshtrain's frees (e2e.preemption, docs/resilience.md "Preemption and stop signals");
    // taken by sigwait on a thread of their own, it interrupts nothing else. A blocked signal
    // stays pending for sigwait whatever its disposition, even SIG_IGN inherited from the
    // parent (Linux queues it rather than discard it; bash ignores SIGINT in background jobs).
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    // A safety net, never run while the mask holds: should a thread ever have them unblocked
    // (a library resetting its mask), the signal is still recorded there instead of ending
    // the rank with no checkpoint. SA_RESTART: that thread's system call resumes.
    struct sigaction action = {};
    action.sa_handler = record_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (const int sig : {SIGTERM, SIGUSR1, SIGINT}) ::sigaction(sig, &action, nullptr);
    std::thread(wait_for_stop_signals, set).detach();
  });
}

int stop_signal_received() noexcept { return g_stop_signal.load(); }

int stop_signals_received() noexcept { return g_stop_signals.load(); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);  // glibc ≥ 2.32
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace meshtrain
