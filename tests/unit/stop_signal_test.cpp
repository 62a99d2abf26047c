// core/stop_signal.h: the handler records the first stop signal and the process goes on; a
// second Ctrl-C ends it. Each case runs in a child process (a death test): installing the
// handlers must not change how this test binary itself reacts to signals.
#include "meshtrain/core/stop_signal.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

namespace meshtrain {
namespace {

TEST(StopSignal, TheFirstSignalIsRecordedAndTheProcessGoesOn) {
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        if (stop_signal_received() != 0) std::_Exit(100);
        std::raise(SIGUSR1);
        std::raise(SIGTERM);  // caught too, but the first one stays
        std::_Exit(stop_signal_received());
      },
      ::testing::ExitedWithCode(SIGUSR1), "");
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        std::raise(SIGTERM);
        std::raise(SIGTERM);  // still caught: a rank may get Slurm's and the launcher's
        std::_Exit(stop_signal_received());
      },
      ::testing::ExitedWithCode(SIGTERM), "");
}

TEST(StopSignal, ASecondCtrlCEndsTheProcess) {
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        std::raise(SIGINT);
        if (stop_signal_received() != SIGINT) std::_Exit(100);
        std::raise(SIGINT);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
}

TEST(StopSignal, NamesSignals) {
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(1000), "signal 1000");
}

}  // namespace
}  // namespace meshtrain
