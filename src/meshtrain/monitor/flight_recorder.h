// src/meshtrain/monitor/flight_recorder.h
//
// FlightRecorder: a fixed ring of this rank's last N communication operations (operation,
// group, sequence number, peer, bytes, start, end or still in flight), which the watchdog
// writes to a file when an operation times out. The idea and the name are PyTorch's NCCL
// flight recorder (torch/csrc/distributed/c10d/FlightRecorder, TORCH_NCCL_TRACE_BUFFER_SIZE).
//
// One thread records (the thread that calls MPI), another may read at any time (the watchdog):
// every field is a relaxed atomic, so a reader never races, and a record caught half-written
// is at worst one line of the dump with mixed fields — the price of a hot path that is a few
// plain stores, with no lock, no allocation and no system call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/comm/comm_op.h"

namespace meshtrain {

/// One operation as read back from the ring.
struct FlightRecord {
  std::uint64_t id = 0;  // 1, 2, 3, ... in recording order
  CommOp op = CommOp::barrier;
  std::uint32_t group = 0;  // the recorder's caller's group id (watchdog: interned name)
  int peer = -1;            // world rank of a send/recv peer, −1 for collectives
  std::uint64_t seq = 0;    // collective: number within the group; p2p: number with that peer
  std::uint64_t bytes = 0;
  std::int64_t start_ns = 0;  // steady clock
  std::int64_t end_ns = 0;    // 0 while in flight
};

class FlightRecorder {
 public:
  /// Keeps the last `capacity` operations (≥ 1); allocates them all now.
  explicit FlightRecorder(std::size_t capacity);

  /// Appends an operation in flight and returns its id. Overwrites the oldest when full.
  std::uint64_t record(CommOp op, std::uint32_t group, int peer, std::uint64_t seq,
                       std::uint64_t bytes, std::int64_t start_ns) noexcept;
  /// Marks operation `id` completed at `end_ns`; nothing when it has left the ring already.
  void finish(std::uint64_t id, std::int64_t end_ns) noexcept;

  /// The operations still in the ring, oldest first (at most capacity()).
  std::vector<FlightRecord> snapshot() const;
  std::size_t capacity() const noexcept { return capacity_; }
  /// Operations recorded since construction (ids run 1 .. recorded()).
  std::uint64_t recorded() const noexcept { return next_id_.load(std::memory_order_relaxed) - 1; }

 private:
  struct Slot {
    std::atomic<std::uint64_t> id{0};  // 0 = never written
    std::atomic<std::uint32_t> op{0};
    std::atomic<std::uint32_t> group{0};
    std::atomic<std::int32_t> peer{-1};
    std::atomic<std::uint64_t> seq{0};
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::int64_t> start_ns{0};
    std::atomic<std::int64_t> end_ns{0};
  };
  std::size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<std::uint64_t> next_id_{1};
};

}  // namespace meshtrain
