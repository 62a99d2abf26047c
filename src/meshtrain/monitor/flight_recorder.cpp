#include "meshtrain/monitor/flight_recorder.h"

#include "meshtrain/core/error.h"

namespace meshtrain {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
}

FlightRecorder::FlightRecorder(std::size_t capacity)
    : capacity_(capacity), slots_(std::make_unique<Slot[]>(capacity)) {
  MT_CHECK(capacity >= 1, "a flight recorder needs at least one slot");
}

std::uint64_t FlightRecorder::record(CommOp op, std::uint32_t group, int peer, std::uint64_t seq,
                                     std::uint64_t bytes, std::int64_t start_ns) noexcept {
  const std::uint64_t id = next_id_.load(kRelaxed);
  next_id_.store(id + 1, kRelaxed);  // one writer: no read-modify-write needed
  Slot& s = slots_[(id - 1) % capacity_];
  // The id goes last with release: a reader that sees it sees the fields of this operation.
  s.id.store(0, kRelaxed);
  s.op.store(static_cast<std::uint32_t>(op), kRelaxed);
  s.group.store(group, kRelaxed);
  s.peer.store(peer, kRelaxed);
  s.seq.store(seq, kRelaxed);
  s.bytes.store(bytes, kRelaxed);
  s.start_ns.store(start_ns, kRelaxed);
  s.end_ns.store(0, kRelaxed);
  s.id.store(id, std::memory_order_release);
  return id;
}

void FlightRecorder::finish(std::uint64_t id, std::int64_t end_ns) noexcept {
  if (id == 0) return;
  Slot& s = slots_[(id - 1) % capacity_];
  // A request waited for long after posting may have been overwritten by newer operations.
  if (s.id.load(kRelaxed) == id) s.end_ns.store(end_ns, kRelaxed);
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  const std::uint64_t next = next_id_.load(std::memory_order_acquire);
  const std::uint64_t first = next > capacity_ ? next - capacity_ : 1;
  std::vector<FlightRecord> out;
  out.reserve(static_cast<std::size_t>(next - first));
  for (std::uint64_t id = first; id < next; ++id) {
    const Slot& s = slots_[(id - 1) % capacity_];
    if (s.id.load(std::memory_order_acquire) != id) continue;  // being rewritten right now
    out.push_back({.id = id,
                   .op = static_cast<CommOp>(s.op.load(kRelaxed)),
                   .group = s.group.load(kRelaxed),
                   .peer = s.peer.load(kRelaxed),
                   .seq = s.seq.load(kRelaxed),
                   .bytes = s.bytes.load(kRelaxed),
                   .start_ns = s.start_ns.load(kRelaxed),
                   .end_ns = s.end_ns.load(kRelaxed)});
  }
  return out;
}

}  // namespace meshtrain
