// src/meshtrain/comm/shared_window.h
//
// SharedWindow: one f32 buffer per member of a group whose ranks all run on one node, in an
// MPI-3 shared-memory window (MPI_Win_allocate_shared), so that every member can load and
// store every member's buffer; and the all-reduce that works on it by loads and stores
// instead of messages.
//
// Why: on one node an MPI all-reduce of gradient buckets is CPU work on the cores that also
// compute — OpenMPI's libnbc schedule for a non-blocking all-reduce copies every bucket
// through temporary buffers in several rounds, and its blocking one still moves the data
// twice. In place over the shared window the sum costs one read of every member's slice and
// one write of the result into every buffer: a 4 MiB bucket between 2 ranks of a 2-vCPU AMD
// EPYC at 11.9 GB/s of bus bandwidth against 0.82 (MPI_Iallreduce) and 2.26 (MPI_Allreduce)
// (bench/allreduce_bench; docs/performance.md). The same idea as DeepSpeed's CPU
// shared-memory all-reduce and NCCL's intra-node SHM transport.
//
// The all-reduce (iall_reduce_sum): a member posts by publishing its post count; when every
// member has posted the same count, the buffer's chunks (64 Ki elements) are claimed one at a
// time from a shared ticket counter by the members that test or wait — except in one call: the
// member whose post completes the set (exactly one: an arrival counter decides) claims nothing
// in its first test() after the post. overlap_grad_reduce tests a bucket right after posting
// it, so without that pause the member that posts last — the one behind in backward — sums
// the whole bucket at once while the others compute, and falls further behind; with it the
// members that are ahead sum the bucket at their next test(), and the last one takes what is
// left at its own next test() or wait() (so a loop of test() calls alone still completes). A
// member that finishes backward early and waits does the work left instead of waiting for
// the late one. Each element's sum is taken in member order (buffer 0 + buffer 1 + …) whoever
// computes it, and stored into every member's buffer: the result is bitwise the same on every
// member, every run, whatever the timing (for 2 members also bitwise MPI's). The chunk's inputs are
// checked for NaN and ±inf before it is summed, in the same pass (one block in L1 at a time), and
// each member's lowest non-finite index is kept: the sum spreads such a value to every member, so
// only the inputs tell whose it was (layers/non_finite_grads.h), and reading them here spares the
// caller a pass of its own. Control words live in the window (member 0's part), as lock-free
// 64-bit atomics in cache lines of their own.
//
// Used by MpiProcessGroup (allocate_shared, do_iall_reduce_sum); knows nothing of models.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "meshtrain/comm/process_group.h"

namespace meshtrain {

class SharedWindow {
 public:
  /// Collective over `node_comm` (every member of which shares this node): allocates `count`
  /// floats per member, zeroed. Throws CommError when MPI cannot, or when count ≥ 2³² (the
  /// non-finite report holds a 32-bit index).
  SharedWindow(MPI_Comm node_comm, std::size_t count);
  /// Collective (MPI_Win_free) on a normal exit; while an exception unwinds (ranks may be on
  /// different paths), the window is left to MPI_Finalize rather than risk a hang.
  ~SharedWindow();
  SharedWindow(const SharedWindow&) = delete;
  SharedWindow& operator=(const SharedWindow&) = delete;

  /// This member's buffer: [count] f32, 64-byte aligned.
  std::span<float> mine() const noexcept { return {buffers_[rank_], count_}; }
  std::size_t count() const noexcept { return count_; }

  /// Posts x ← scale · Σ over members of x for every member's buffer (see the file comment;
  /// the product is taken of the f32 sum, in the pass that stores it). Every member must post,
  /// in the same order and with the same scale; a member's next post must come after its
  /// previous request completed (else throws Error). The request's test() reduces claimable
  /// chunks and never blocks — but the first test() of the member whose post completed the set
  /// claims none (see the file comment); wait() reduces claimable chunks and spins (yielding
  /// the core) until every chunk is done. Its first_non_finite_input() is this member's
  /// lowest-index NaN or ±inf of the post. Requires count() < 2³² (the index shares a 64-bit word
  /// with the value).
  std::unique_ptr<CommRequest> iall_reduce_sum(float scale);

 private:
  friend class SharedAllReduce;
  struct alignas(64) Line {
    std::atomic<std::uint64_t> value;
  };
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
  static constexpr int kCounterLines = 3;  // claimed, done, arrivals; then posted, non_finite
  Line& claimed() const noexcept { return control_[0]; }
  Line& done() const noexcept { return control_[1]; }
  /// Posts of all members so far: the member whose increment makes it epoch · size is the last
  /// to post `epoch` (a read-modify-write, so exactly one member is).
  Line& arrivals() const noexcept { return control_[2]; }
  Line& posted(int member) const noexcept { return control_[kCounterLines + member]; }
  /// Member's lowest non-finite input of its latest post, as (index << 32) | the value's bits;
  /// kAllFinite when none. Reset by the member as it posts, lowered by whoever sums a chunk.
  Line& non_finite(int member) const noexcept { return control_[kCounterLines + size_ + member]; }
  static constexpr std::uint64_t kAllFinite = ~std::uint64_t{0};
  std::size_t chunks() const noexcept;
  void reduce_chunk(std::size_t chunk, float scale) const noexcept;
  /// Reduces chunks of post `epoch` (× scale) while there are unclaimed ones and every member
  /// has posted it (`claim` false: none); true when all of them are done.
  bool advance(std::uint64_t epoch, float scale, bool claim) const noexcept;
  /// This member's first non-finite input of its latest post; only once that post is done.
  std::optional<NonFiniteInput> first_non_finite_input() const noexcept;

  MPI_Win win_ = MPI_WIN_NULL;
  int rank_ = 0;
  int size_ = 0;
  std::size_t count_ = 0;
  std::vector<float*> buffers_;  // every member's buffer, mapped into this process
  std::vector<std::atomic<std::uint64_t>*> non_finite_lines_;  // &non_finite(m).value
  Line* control_ = nullptr;      // claimed, done, arrivals, posted[size], non_finite[size]
  std::uint64_t epoch_ = 0;      // this member's posts so far
};

}  // namespace meshtrain
