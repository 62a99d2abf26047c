// bench/watchdog_bench.cpp — what the watchdog adds to each communication operation: the
// posted / blocking / done calls ProcessGroup makes, 2·10⁶ times, with the watchdog stopped
// (progress counters only) and running (plus the flight recorder), against the two clock reads
// every operation makes anyway. One process, no MPI. docs/resilience.md quotes the figures.
#include <fmt/format.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "meshtrain/monitor/watchdog.h"

namespace {

using namespace meshtrain;

double ns_per_operation(Watchdog& watchdog, const watchdog::GroupHandle& group, int n) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= n; ++i) {
    const watchdog::OpInfo op{.op = CommOp::all_reduce,
                              .group = group,
                              .seq = static_cast<std::uint64_t>(i),
                              .bytes = 64};
    const std::int64_t start = watchdog::now_ns();
    const std::uint64_t id = watchdog.posted(op, start);
    watchdog.blocking(op, start);
    watchdog.done(id, op, watchdog::now_ns());
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         n;
}

}  // namespace

int main() {
  constexpr int kOps = 2'000'000;
  Watchdog watchdog;
  const watchdog::GroupHandle group = watchdog.register_group("world{0,1}", {0, 1});
  ns_per_operation(watchdog, group, kOps);  // warm-up
  const double stopped = ns_per_operation(watchdog, group, kOps);
  std::string dir = "/tmp/meshtrain-watchdog-bench-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) return 1;
  watchdog.start_local(dir, 0, {.timeout_s = 600.0, .recorder_size = 256, .on_expiry = {}});
  ns_per_operation(watchdog, group, kOps);
  const double running = ns_per_operation(watchdog, group, kOps);
  watchdog.stop();
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t sink = 0;
  for (int i = 0; i < kOps; ++i) sink += watchdog::now_ns() - watchdog::now_ns();
  const double clocks =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
      kOps;
  fmt::print(
      "ns per operation: watchdog stopped {:.1f}, running {:.1f}; the two clock reads alone "
      "{:.1f}{}\n",
      stopped, running, clocks, sink > 0 ? " " : "");
  watchdog.unregister_group(group);
  return 0;
}
