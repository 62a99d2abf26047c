// src/meshtrain/monitor/watchdog.h
//
// The watchdog (DESIGN invariant 7, "no silent hang"): a background thread that ends the job
// when one communication operation — a collective, a send/recv, or the wait() of a posted
// request — has blocked longer than parallel.comm_timeout_s. Before ending it writes to stderr
// the operation, its group, its sequence number, its bytes, how long it waited and which peers
// have not reached that sequence number (read from their progress files, progress_board.h, not
// through MPI, which is stuck; peers on other hosts, whose files live there, are named as
// unreachable with no report), and dumps this rank's last parallel.flight_recorder_size
// operations (flight_recorder.h) to a file whose path the report prints; peers are asked to dump
// theirs beside it. Then the process exits with code 4 (kWatchdogExitCode) and mpirun ends the
// other ranks. Modelled on PyTorch's ProcessGroupNCCL watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING,
// TORCH_NCCL_DUMP_ON_TIMEOUT) and its flight recorder.
//
// It is a CommObserver (comm/comm_observer.h): the trainer attaches it to the world group, and
// every group split from that one reports its operations to it. The calls are a few relaxed
// atomic stores (no lock, no allocation, no system call), and only the progress records are
// kept while the watchdog is stopped. The thread wakes every min(timeout / 4, 0.5 s): a hang
// is reported between timeout and timeout + 0.5 s after it began. One thread per process
// drives communication (MPI_THREAD_FUNNELED): one operation blocks at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/comm_observer.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/monitor/flight_recorder.h"
#include "meshtrain/monitor/progress_board.h"

namespace meshtrain {

/// The exit code of a rank the watchdog ended (1–3 are the CLI's, apps/main.cpp).
inline constexpr int kWatchdogExitCode = 4;

struct WatchdogOptions {
  double timeout_s = 600.0;         // parallel.comm_timeout_s, > 0
  std::size_t recorder_size = 256;  // parallel.flight_recorder_size, ≥ 1
  // Tests only: called with the report instead of dumping peers and ending the process.
  std::function<void(const std::string& report)> on_expiry;
};

namespace watchdog {

/// A group as the watchdog knows it, from registration to unregistration.
struct GroupHandle {
  int slot = -1;              // progress-board slot, −1 when none was free
  std::uint32_t name_id = 0;  // interned name, for the flight recorder
  std::uint64_t key = 0;      // the same on every member (progress::group_key)
};

/// One operation: p2p ones carry the peer's world rank and a sequence number per (group,
/// direction, peer); collectives carry −1 and the group's collective sequence number.
struct OpInfo {
  CommOp op = CommOp::barrier;
  GroupHandle group;
  int peer = -1;
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;
};

/// Steady-clock nanoseconds (the clock every record uses, ProcessGroup's too).
std::int64_t now_ns() noexcept;

}  // namespace watchdog

/// The watchdog of this process's groups. Starting and stopping are not thread-safe: the main
/// thread calls them, with no operation in flight. Groups register on any thread (locked).
class Watchdog final : public CommObserver {
 public:
  Watchdog();
  /// Stops it when running. Every group it watches must be gone or detached before.
  ~Watchdog() override;
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // CommObserver: the calls below, made by the groups it watches.
  using CommObserver::posted;  // a non-blocking post changes nothing here
  std::uint64_t group_added(const ProcessGroup& group) override;
  void group_removed(const ProcessGroup& group, std::uint64_t id) noexcept override;
  std::uint64_t started(const CommEvent& op, std::int64_t at_ns) noexcept override;
  void blocking(const CommEvent& op, std::int64_t at_ns) noexcept override;
  void not_blocking() noexcept override;
  void finished(const CommEvent& op, CommEnd how, std::int64_t start_ns,
                std::int64_t end_ns) noexcept override;

  /// A group by hand (tests and the bench drive the watchdog without MPI): claims its progress
  /// slot; unregister_group releases it.
  watchdog::GroupHandle register_group(const std::string& name,
                                       const std::vector<int>& world_ranks);
  void unregister_group(const watchdog::GroupHandle& group) noexcept;
  /// The operation has been posted (a collective: entered); returns its flight-recorder id, 0
  /// while the watchdog is stopped.
  std::uint64_t posted(const watchdog::OpInfo& op, std::int64_t at_ns) noexcept;
  /// The calling thread now blocks until the operation completes: the timeout runs from `at_ns`.
  void blocking(const watchdog::OpInfo& op, std::int64_t at_ns) noexcept;
  /// The operation completed (or failed): ends the blocking and closes its record.
  void done(std::uint64_t id, const watchdog::OpInfo& op, std::int64_t at_ns) noexcept;

  /// Collective over `world` (every rank calls it): rank 0 cleans the directories of jobs that
  /// are gone and creates this job's, `$TMPDIR/meshtrain-watchdog-XXXXXX` (/tmp without
  /// TMPDIR) with its owner file (watchdog_dirs.h), and broadcasts its name; a rank on another
  /// host, where it does not exist, creates it under the same name (mode 0700); every rank maps
  /// its progress file there; one all_gather collects every rank's host name (peers on other
  /// hosts whose file is not readable are reported as unreachable, not as arrived); and a
  /// barrier makes sure all files exist before the first watched operation. Does nothing for a
  /// world of one rank (nothing can hang) or when the
  /// watchdog already runs. Throws CommError on every rank when rank 0 cannot create the
  /// directory; a rank that cannot create its own file goes on without it (a warning; peers
  /// report it as unknown).
  void start(ProcessGroup& world, const WatchdogOptions& options);
  /// The same in one process, in `dir` (which must exist), as world rank `world_rank`.
  void start_local(const std::string& dir, int world_rank, const WatchdogOptions& options);
  /// Stops the thread, deletes this rank's progress file and the directory once it is empty
  /// (flight-recorder dumps stay). Safe to call when not running.
  void stop() noexcept;
  bool running() const noexcept;

  /// The flight recorder's operations, oldest first (empty when stopped).
  std::vector<FlightRecord> recorder_snapshot() const;
  /// The interned name of a FlightRecord's group.
  std::string group_name(std::uint32_t name_id) const;
  /// Where this rank's flight recorder is dumped on expiry ("" when stopped).
  std::string dump_path() const;
  /// This rank's progress records (what peers read from its file while it runs).
  const progress::Board& progress() const noexcept;

  struct State;  // watchdog.cpp

 private:
  std::unique_ptr<State> state_;
};

/// Runs `watchdog` for a scope (the Trainer's lifetime) and stops it at the end, when this
/// scope was the one that started it.
class WatchdogScope {
 public:
  WatchdogScope(Watchdog& watchdog, ProcessGroup& world, const WatchdogOptions& options);
  ~WatchdogScope();
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  Watchdog& watchdog_;
  bool owner_ = false;
};

}  // namespace meshtrain
