// tests/e2e/watchdog_probe.cpp — a few collectives over the world under the watchdog, with one
// rank misbehaving on purpose, for watchdog.sh (run under mpirun):
//   watchdog_probe <scenario> <timeout_s>
//   sleep     the last rank sleeps (2 min) before the third all-reduce: the others time out
//   skip      the last rank skips the third all-reduce and leaves (stops its watchdog, exits)
//   mismatch  parallel.debug_collectives on; the last rank's third all-reduce has 5 elements,
//             the others' 4: every rank fails with both calls listed (exit 1)
//   recv      world rank 0 receives from rank 1, which never sends
//   freeze    the last rank enters the third all-reduce at once and stops itself (SIGSTOP)
//             200 ms later, inside it; the others enter 600 ms later: it looks like a rank
//             waiting in the collective, but its heartbeat stops (issue 17, kill -STOP)
//   ok        nothing goes wrong (exit 0)
// Rank 0 prints the sequence number of the all-reduce that should hang, for the script to
// check against the report.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/core/error.h"
#include "meshtrain/monitor/watchdog.h"

int main(int argc, char** argv) {
  using namespace meshtrain;
  MpiRuntime runtime(&argc, &argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: watchdog_probe sleep|skip|mismatch|recv|freeze|ok <timeout_s>\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const double timeout_s = std::atof(argv[2]);
  Watchdog watchdog;  // declared first: it outlives the group it watches
  const auto world = runtime.world_group();
  world->add_observer(watchdog);
  const int me = world->rank();
  const bool last = me == world->size() - 1;
  world->set_debug_checks(scenario == "mismatch");
  try {
    const WatchdogScope scope(watchdog, *world,
                              {.timeout_s = timeout_s, .recorder_size = 8, .on_expiry = {}});
    std::vector<float> x(4, 1.0f);
    for (int step = 0; step < 2; ++step) world->all_reduce_sum(x);
    if (me == 0) {
      fmt::print("probe: the third all_reduce is collective #{} of {}\n",
                 world->collectives_called() + 1, world->name());
      std::fflush(stdout);
    }
    if (scenario == "recv") {
      if (me == 0) world->recv(x, 1, /*tag=*/7);
      if (me == 1) std::this_thread::sleep_for(std::chrono::minutes(2));
    }
    if (scenario == "sleep" && last) std::this_thread::sleep_for(std::chrono::minutes(2));
    if (scenario == "skip" && last) return 0;
    if (scenario == "freeze" && last) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ::kill(::getpid(), SIGSTOP);
      }).detach();
    } else if (scenario == "freeze") {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
    }
    std::vector<float> y(scenario == "mismatch" && last ? 5 : 4, 1.0f);
    world->all_reduce_sum(y);
    world->barrier();
  } catch (const Error& e) {
    std::fprintf(stderr, "probe: world rank %d: %s\n", me, e.what());
    return 1;
  }
  return 0;
}
