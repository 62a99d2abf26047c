#include "meshtrain/core/stop_signal.h"

#include <atomic>
#include <csignal>
#include <cstring>
#include <string>

namespace meshtrain {
namespace {

// Read and written from a signal handler: must never take a lock.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void record_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);  // the first one wins
}

void install(int sig, int extra_flags) {
  struct sigaction action = {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a thread interrupted in a system call (a checkpoint write, MPI's poll) resumes
  // it instead of failing with EINTR.
  action.sa_flags = SA_RESTART | extra_flags;
  ::sigaction(sig, &action, nullptr);
}

}  // namespace

void install_stop_signal_handlers() {
  install(SIGTERM, 0);
  install(SIGUSR1, 0);
  install(SIGINT, SA_RESETHAND);
}

int stop_signal_received() noexcept { return g_stop_signal.load(); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);  // glibc ≥ 2.32
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace meshtrain
