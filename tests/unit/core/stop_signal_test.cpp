// core/stop_signal.h: the first stop signal is recorded by the signal thread and the process
// goes on; a second Ctrl-C ends it. Each case runs in a child process (a death test):
// installing the signal thread must not change how this test binary itself reacts to signals.
// Signals are sent to the process (kill), as Slurm and mpirun send them; the thread takes
// them a moment later, so each case waits for the count (at most 10 s, then exit 101).
#include "meshtrain/core/stop_signal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

namespace meshtrain {
namespace {

// Sends `sig` to this process and waits until the signal thread has taken it.
void send_and_wait(int sig) {
  const int before = stop_signals_received();
  ::kill(::getpid(), sig);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (stop_signals_received() == before) {
    if (std::chrono::steady_clock::now() > deadline) std::_Exit(101);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(StopSignal, TheFirstSignalIsRecordedAndTheProcessGoesOn) {
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        if (stop_signal_received() != 0) std::_Exit(100);
        send_and_wait(SIGUSR1);
        send_and_wait(SIGTERM);  // taken too, but the first one stays
        std::_Exit(stop_signal_received());
      },
      ::testing::ExitedWithCode(SIGUSR1), "");
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        send_and_wait(SIGTERM);
        send_and_wait(SIGTERM);  // still taken: a rank may get Slurm's and the launcher's
        std::_Exit(stop_signals_received() == 2 ? stop_signal_received() : 102);
      },
      ::testing::ExitedWithCode(SIGTERM), "");
}

TEST(StopSignal, ASecondCtrlCEndsTheProcess) {
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        send_and_wait(SIGINT);
        if (stop_signal_received() != SIGINT) std::_Exit(100);
        ::kill(::getpid(), SIGINT);
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
}

// A SIGINT the parent set to be ignored (bash does for background jobs) still stops the run:
// blocked, it is queued for the signal thread rather than discarded.
TEST(StopSignal, AnInheritedIgnoredSigintIsStillTaken) {
  EXPECT_EXIT(
      {
        std::signal(SIGINT, SIG_IGN);
        install_stop_signal_handlers();
        send_and_wait(SIGINT);
        std::_Exit(stop_signal_received());
      },
      ::testing::ExitedWithCode(SIGINT), "");
}

// Threads started after the install (MPI's, OpenMP's, the watchdog's) inherit the mask: a stop
// signal never interrupts them, so a blocking call of theirs cannot fail with EINTR.
TEST(StopSignal, ThreadsStartedAfterwardsBlockTheStopSignals) {
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        bool blocked = false;
        std::thread([&blocked] {
          sigset_t mask;
          ::pthread_sigmask(SIG_BLOCK, nullptr, &mask);
          blocked = sigismember(&mask, SIGTERM) == 1 && sigismember(&mask, SIGUSR1) == 1 &&
                    sigismember(&mask, SIGINT) == 1;
        }).join();
        std::_Exit(blocked ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(StopSignal, NamesSignals) {
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(1000), "signal 1000");
}

}  // namespace
}  // namespace meshtrain
