// src/meshtrain/monitor/progress_board.h
//
// The watchdog's side channel: each rank publishes, per group it belongs to, the last
// collective sequence number it entered and completed, and the operation it is blocked in
// right now, in a small file mapped into memory (`<dir>/rank<R>.progress`). When a rank's
// operation times out, it reads its peers' files to say which of them have not reached that
// sequence number — without MPI, which is stuck in the very operation being reported. PyTorch
// answers the same question through its TCPStore (ProcessGroupNCCL's desync debug); a file in
// a directory every rank sees needs no server. Ranks on other nodes see each other only when
// that directory is on a shared file system (TMPDIR); otherwise the report names them as
// unreachable, on another host, with no report (watchdog.cpp).
//
// Updating a record is a relaxed atomic store into the mapping: no system call. Before the
// watchdog maps a file, the records live in process memory, so groups can be numbered from
// the start of the job. Each Watchdog holds its rank's board (LocalBoard); peers read theirs
// through the files only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::progress {

inline constexpr std::size_t kMaxGroups = 256;               // groups alive at once on one rank
inline constexpr std::uint64_t kMagic = 0x3230474f52505447;  // "GTPROG02"

/// One group this rank belongs to. `key` names the group identically on every member.
struct Slot {
  std::atomic<std::uint64_t> key{0};  // 0 = free
  std::atomic<std::uint64_t> entered{0};
  std::atomic<std::uint64_t> completed{0};
  char name[40] = {};  // display only, may be cut
};

/// The whole file. Fixed layout (same binary on every rank); version in `magic`.
struct Board {
  std::uint64_t magic = kMagic;
  std::int32_t world_rank = -1;
  std::int32_t pid = 0;
  // The operation this rank is blocked in now: current_op = CommOp + 1, 0 when none.
  std::atomic<std::uint32_t> current_op{0};
  std::atomic<std::int32_t> current_peer{-1};
  std::atomic<std::uint64_t> current_key{0};
  std::atomic<std::uint64_t> current_seq{0};
  std::atomic<std::uint64_t> current_bytes{0};
  std::atomic<std::int64_t> current_since_ns{0};
  // A timed-out peer asks this rank to dump its flight recorder too; the rank answers in
  // `dumped` once its file is written.
  std::atomic<std::uint32_t> dump_requested{0};
  std::atomic<std::uint32_t> dumped{0};
  // 1 while the rank's watchdog runs, 2 once it stopped (the rank left training: finished, or
  // failed on its own). The file stays until every rank has stopped, so a rank that waits
  // for one that left can still read how far it got.
  std::atomic<std::uint32_t> state{0};
  // Steady-clock time (ns) of the watchdog thread's last tick: a heartbeat that a stopped
  // process (SIGSTOP, a debugger) stops advancing, while a rank blocked in MPI still beats.
  // A rank frozen inside a collective otherwise looks exactly like one waiting in it.
  std::atomic<std::int64_t> heartbeat_ns{0};
  Slot slots[kMaxGroups];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "records in shared memory must be lock-free atomics");

/// The key every member of a group derives alike: its name ("dp{0,2}") and how many groups of
/// that name this process created before it (creation is collective over the members, so the
/// count agrees).
std::uint64_t group_key(std::string_view name, std::uint32_t instance) noexcept;

/// This rank's board: process memory until map_file(), then the mapped file. Owned by the
/// Watchdog; its records are written by the thread that communicates, read by the watchdog's.
class LocalBoard {
 public:
  LocalBoard();
  /// Unmaps the file when mapped (without the cleanup of unmap_file).
  ~LocalBoard();
  LocalBoard(const LocalBoard&) = delete;
  LocalBoard& operator=(const LocalBoard&) = delete;

  Board& get() const noexcept { return *board_.load(std::memory_order_relaxed); }

  /// Claims a free slot for a group; −1 when all kMaxGroups are taken (the group then goes
  /// without progress records: reports call its peers "unknown").
  int claim_slot(std::uint64_t key, std::string_view name) noexcept;
  void release_slot(int slot) noexcept;

  /// Creates `path` holding the current board and switches get() to it; false (and the board
  /// stays in memory) when the file cannot be created or mapped.
  bool map_file(const std::string& path, int world_rank);
  /// Copies the board back into process memory, marks the file stopped and unmaps it; the
  /// last rank to stop deletes every progress file of `dir`, its owner file, and then `dir` if
  /// nothing else is in it (flight-recorder dumps stay; watchdog_dirs.h says who cleans up
  /// after a job that did not stop).
  void unmap_file(const std::string& dir) noexcept;

 private:
  std::unique_ptr<Board> memory_;  // the records while no file is mapped
  std::atomic<Board*> board_;
};

/// What a peer's file says, read without locks (values may be a moment old).
struct PeerView {
  bool in_group = false;  // the peer has a slot with the key asked for
  std::uint64_t entered = 0, completed = 0;
  std::uint32_t current_op = 0;  // CommOp + 1, 0 = not blocked in an operation
  int current_peer = -1;
  std::uint64_t current_key = 0, current_seq = 0;
  std::string current_group;  // name from the peer's slot for current_key
  bool dumped = false;
  bool stopped = false;           // its watchdog has stopped: it left training
  std::int64_t heartbeat_ns = 0;  // its watchdog's last tick (steady clock), 0 = none yet
};
/// Reads `path` (nullopt when missing or not a board); with `request_dump`, also asks the peer
/// to dump its flight recorder.
std::optional<PeerView> read_peer(const std::string& path, std::uint64_t key, bool request_dump);

}  // namespace meshtrain::progress
