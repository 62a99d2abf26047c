// src/meshtrain/comm/process_group.h
//
// ProcessGroup: the collectives and point-to-point operations of a group of ranks, with bytes
// and calls counted per operation (DESIGN invariant 5). The MPI backend (mpi_process_group.h)
// is the only implementation today; a NCCL one can be added behind the same interface.
// Knows nothing of models. Every operation is blocking except the i-prefixed ones, which return
// a CommRequest; a group of one rank returns at once and counts nothing, so a parallel layer
// with a group of size 1 is the plain layer.
//
// Byte counters record the message size D this rank hands to the operation (for all-gather and
// all-to-all: the bytes of this rank's input), not what the algorithm puts on the wire; the
// planner turns D into wire bytes with the ring formulas (e.g. all-reduce 2(N−1)/N·D). The
// seconds counter is the wall time spent inside operations, including waiting for late peers.
//
// Every operation is also reported to the group's observers (comm_observer.h), with the same
// bytes the counters count: in training the watchdog and its flight recorder
// (monitor/watchdog.h) and the trace (monitor/trace_observer.h), which the trainer attaches to
// the world group before it builds the DeviceMesh; split() hands them on to the new groups.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/comm/comm_observer.h"
#include "meshtrain/comm/comm_op.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {

struct CommCounter {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  double seconds = 0.0;  // wall time inside the operation, waiting for peers included
};

/// A non-finite element one member put into a reduction: its index in that member's buffer
/// and its value (NaN or ±inf).
struct NonFiniteInput {
  std::int64_t element = 0;
  float value = 0.0f;
};

/// A posted non-blocking operation (isend / irecv). wait() blocks until it has completed; it
/// may be called more than once. Destroying a request that was not waited for waits for it,
/// so a buffer is never freed under a pending transfer.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  /// True when the operation has completed (then wait() returns at once); never blocks.
  virtual bool test() = 0;
  /// The lowest-index non-finite element this member put into this operation, for a request
  /// that checks its inputs as it reduces them (iall_reduce_sum of an allocate_shared buffer);
  /// nullopt when every input was finite, and always for a request that does not check. A
  /// checking request must have completed and its buffer not been posted again (else throws
  /// Error: the answer would be about another post).
  virtual std::optional<NonFiniteInput> first_non_finite_input() const { return std::nullopt; }
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This rank's index in the group, 0 ≤ rank() < size().
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(world_ranks_.size()); }
  /// World ranks of the members, in group-rank order.
  const std::vector<int>& world_ranks() const noexcept { return world_ranks_; }
  /// e.g. "dp{0,2}", used in logs and error reports.
  const std::string& name() const noexcept { return name_; }

  /// In place: x ← Σ over ranks of x. Element-wise; every rank passes the same size. Integers
  /// travel as integers (exact; a sum beyond the type's range is undefined, as in MPI).
  void all_reduce_sum(std::span<float> x);
  void all_reduce_sum(std::span<double> x);
  void all_reduce_sum(std::span<std::int32_t> x);
  void all_reduce_sum(std::span<std::int64_t> x);
  /// In place: x ← max over ranks of x.
  void all_reduce_max(std::span<float> x);
  void all_reduce_max(std::span<std::int32_t> x);
  /// In place: x ← root's x (bytes of any type).
  void broadcast(std::span<std::byte> x, int root);
  void barrier();
  /// in [size() · n] → out [n]: out = Σ over ranks of in's slice [rank()·n, (rank()+1)·n).
  void reduce_scatter_sum(std::span<const float> in, std::span<float> out);
  /// in [n] → out [size() · n], rank r's input at [r·n, (r+1)·n).
  void all_gather(std::span<const float> in, std::span<float> out);
  void all_gather(std::span<const std::int32_t> in, std::span<std::int32_t> out);
  /// in [size() · n] → out [size() · n]: out's slice r is rank r's input slice rank().
  void all_to_all(std::span<const float> in, std::span<float> out);
  void all_to_all(std::span<const std::int32_t> in, std::span<std::int32_t> out);
  /// Variable-size all-to-all (MPI_Alltoallv): `in` holds send_counts[r] elements for group
  /// rank r, back to back in rank order; `out` receives recv_counts[r] elements from rank r,
  /// back to back in rank order. recv_counts[r] must be rank r's send_counts[rank()] (exchange
  /// the counts first, e.g. with all_to_all): MT_CHECKs only this rank's own sizes (in, out
  /// against the sums, counts ≥ 0, one count per rank). Counted as all_to_all, with this
  /// rank's input bytes. In debug mode (set_debug_checks) the ranks also compare every pair of
  /// counts and all throw, naming the pairs that differ, instead of hanging or truncating.
  /// Expert parallelism's token dispatch and combine run on it.
  void all_to_allv(std::span<const float> in, std::span<const std::int64_t> send_counts,
                   std::span<float> out, std::span<const std::int64_t> recv_counts);
  /// Point to point with group rank `peer`; `tag` separates concurrent streams.
  void send(std::span<const float> x, int peer, int tag);
  void recv(std::span<float> x, int peer, int tag);
  /// Non-blocking point to point: returns at once; x must stay alive and untouched until the
  /// request's wait() returns. Bytes are counted when posted (as send / recv), the time spent in
  /// wait() is added to the same counter's seconds. Matching is by (peer, tag) in posting order
  /// (MPI's rule), so two ranks that both send first never deadlock.
  std::unique_ptr<CommRequest> isend(std::span<const float> x, int peer, int tag);
  std::unique_ptr<CommRequest> irecv(std::span<float> x, int peer, int tag);
  /// Non-blocking all_gather (MPI_Iallgather): same contract as all_gather; `in` and `out`
  /// must stay alive and untouched until wait() returns. Every rank posts the group's
  /// non-blocking collectives in the same order (MPI's rule for matching them). Bytes are
  /// counted when posted, the time in wait() is added to all_gather's seconds. ZeRO-3 issues
  /// the next layer's parameter gather with it while the current layer computes.
  std::unique_ptr<CommRequest> iall_gather(std::span<const float> in, std::span<float> out);
  /// Non-blocking all_reduce_sum (MPI_Iallreduce, in place, in chunks of ≤ 4 MiB so that no
  /// single MPI call pays the large-message collapse of the machine notes): returns at once;
  /// x must stay alive and untouched until the request's wait() (or a test() that returned
  /// true) says it is done. Every rank posts the group's non-blocking collectives in the same
  /// order. Counted as all_reduce (one call, x's bytes) when posted; the seconds blocked in
  /// wait() are added to all_reduce's seconds; watched and traced as iall_gather. OpenMPI
  /// moves a non-blocking collective forward only inside MPI calls: a caller overlapping it
  /// with compute calls test() now and then (data-parallel gradient buckets do, per layer).
  /// The result does not depend on when the request is tested or waited for, but may differ in
  /// the last bits from all_reduce_sum's (OpenMPI's non-blocking and blocking collectives
  /// choose their algorithms apart): callers that compare runs use one of the two throughout.
  /// `scale` multiplies every sum once it is complete (x ← scale · Σ, bitwise the sum rounded
  /// to f32 then multiplied; 1/size() gives data parallel's mean gradient); every member passes
  /// the same scale. Over a shared window the product is stored as the sum is, in the same pass
  /// (no second pass over x); by messages it is a pass after the last chunk arrives, inside
  /// wait() or the test() that completes, and its seconds count as the all-reduce's.
  std::unique_ptr<CommRequest> iall_reduce_sum(std::span<float> x, float scale = 1.0f);
  /// A zeroed f32 tensor [count], counted under `category`, in a shared-memory window that
  /// every member can load from and store to, when every member runs on this node (MPI-3
  /// MPI_Win_allocate_shared; comm/shared_window.h); an undefined Tensor otherwise, for a group
  /// of one, or when any member's environment sets MESHTRAIN_SHM_ALL_REDUCE=0 (throws
  /// ConfigError, before any collective, for a value other than 0 or 1). iall_reduce_sum of
  /// exactly such a tensor's span is then done in place by loads and stores (each element
  /// summed in rank order, bitwise the same on every rank and in every run) instead of by
  /// messages, and checks every member's input as it sums it: the request's
  /// first_non_finite_input() names this member's first NaN or ±inf, so a caller that wants
  /// to know where a non-finite value came from need not read its buffer before posting.
  /// Collective over this group, in the same order on every member; all members get a window
  /// or none does (none when count ≥ 2³²).
  Tensor allocate_shared(std::int64_t count, MemCategory category);
  /// Non-blocking reduce_scatter_sum: in [size() · n] → out [n], out = Σ over ranks of in's
  /// slice [rank()·n, (rank()+1)·n). The same ring and the same additions as the blocking
  /// reduce_scatter_sum (each step's sum is `own input + received`, in the ring's fixed order),
  /// so the result is bitwise reduce_scatter_sum's whenever it is tested or waited for. `in`
  /// is the ring's receive space too: its contents are undefined once the request completes
  /// (no scratch block is allocated). Both spans must stay alive and untouched until wait()
  /// (or a test() that returned true). The ring's steps are point-to-point messages on a
  /// duplicate of the group's communicator (made at the first call, which is collective),
  /// each posted by test() or wait() once the previous step has arrived: a caller
  /// overlapping it with compute calls test() now and then, and every rank waits for its
  /// requests at the same points of its program (then no rank can block a peer's ring).
  /// Counted as reduce_scatter (one call, in's bytes) when posted; the seconds blocked in
  /// wait() are added to reduce_scatter's seconds. ZeRO-1/2/3 post their gradient
  /// reduce-scatters with it (parallel.overlap_grad_reduce).
  std::unique_ptr<CommRequest> ireduce_scatter_sum(std::span<float> in, std::span<float> out);

  /// A new group of the members that pass the same `color`, ordered by `key`, named
  /// `axis_name`{ranks}, with this group's observers (in the same order) and debug mode.
  /// Collective over this group: every member calls it, in the same order.
  std::unique_ptr<ProcessGroup> split(int color, int key, std::string axis_name) const;

  /// From now on every operation of this group is reported to `observer` (comm_observer.h),
  /// after the observers added before it; calls observer.group_added now. The observer must
  /// outlive the group or be removed first. Throws Error when kMaxCommObservers are attached
  /// already or `observer` is. Not thread-safe: the thread that communicates calls it, with
  /// no operation in flight.
  void add_observer(CommObserver& observer);
  /// Stops reporting to `observer` (calls its group_removed); nothing when it is not attached.
  void remove_observer(CommObserver& observer) noexcept;

  /// Collectives this group has run (p2p excluded): the sequence number of the last one.
  std::uint64_t collectives_called() const noexcept { return collective_seq_; }
  /// Debug mode of this group (parallel.debug_collectives; off by default, and split() hands
  /// it on): before every collective of a group of more than one rank, the ranks exchange
  /// what they are about to call — operation, element type and count, root, sequence number —
  /// over the same group, and when the calls differ every rank throws an Error listing each
  /// rank's call, instead of hanging or reducing mismatched buffers (PyTorch's
  /// TORCH_DISTRIBUTED_DEBUG=DETAIL does the same check). Costs one small all-reduce per
  /// collective. Every member sets the same value.
  void set_debug_checks(bool on) noexcept { debug_checks_ = on; }
  bool debug_checks() const noexcept { return debug_checks_; }

  const CommCounter& counter(CommOp op) const noexcept {
    return counters_[static_cast<std::size_t>(op)];
  }
  void reset_counters() noexcept { counters_ = {}; }

 protected:
  ProcessGroup(int rank, std::vector<int> world_ranks, std::string axis_name);

  // split()'s backend part: the new group, without observers.
  virtual std::unique_ptr<ProcessGroup> do_split(int color, int key,
                                                 std::string axis_name) const = 0;
  // Backend operations; called only when size() > 1, after counting.
  virtual void do_all_reduce_sum(std::span<float> x) = 0;
  virtual void do_all_reduce_sum(std::span<double> x) = 0;
  virtual void do_all_reduce_sum(std::span<std::int32_t> x) = 0;
  virtual void do_all_reduce_sum(std::span<std::int64_t> x) = 0;
  virtual void do_all_reduce_max(std::span<float> x) = 0;
  virtual void do_all_reduce_max(std::span<std::int32_t> x) = 0;
  virtual void do_broadcast(std::span<std::byte> x, int root) = 0;
  virtual void do_barrier() = 0;
  virtual void do_reduce_scatter_sum(std::span<const float> in, std::span<float> out) = 0;
  virtual void do_all_gather(std::span<const float> in, std::span<float> out) = 0;
  virtual void do_all_gather(std::span<const std::int32_t> in, std::span<std::int32_t> out) = 0;
  virtual void do_all_to_all(std::span<const float> in, std::span<float> out) = 0;
  virtual void do_all_to_all(std::span<const std::int32_t> in, std::span<std::int32_t> out) = 0;
  virtual void do_all_to_allv(std::span<const float> in, std::span<const std::int64_t> send_counts,
                              std::span<float> out, std::span<const std::int64_t> recv_counts) = 0;
  virtual void do_send(std::span<const float> x, int peer, int tag) = 0;
  virtual void do_recv(std::span<float> x, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> do_isend(std::span<const float> x, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> do_irecv(std::span<float> x, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> do_iall_gather(std::span<const float> in,
                                                      std::span<float> out) = 0;
  virtual std::unique_ptr<CommRequest> do_iall_reduce_sum(std::span<float> x, float scale) = 0;
  virtual Tensor do_allocate_shared(std::int64_t count, MemCategory category);
  virtual std::unique_ptr<CommRequest> do_ireduce_scatter_sum(std::span<float> in,
                                                              std::span<float> out) = 0;

 private:
  // For the whole of one blocking operation: numbers it (collectives: and runs the debug
  // check), counts its call and bytes, tells the observers it started and blocks, and at
  // scope exit adds its seconds and tells them it finished. Non-blocking posts keep it only
  // while posting (blocks = false); their request reports the wait.
  class OpGuard {
   public:
    // A collective; `call` indexes kCallNames in the .cpp.
    OpGuard(ProcessGroup& group, CommOp op, int call, std::size_t elements, std::size_t bytes,
            int root, bool blocks = true);
    // Point to point with group rank `peer`.
    OpGuard(ProcessGroup& group, CommOp op, int peer, std::size_t bytes, bool blocks = true);
    OpGuard(const OpGuard&) = delete;
    ~OpGuard();
    // A non-blocking post, handed to the backend: tells the observers, and returns `request`
    // wrapped so that its wait is timed and reported too.
    std::unique_ptr<CommRequest> posted(std::unique_ptr<CommRequest> request);
    ProcessGroup& group;
    CommCounter& counter;
    CommObservers::Op op;  // p2p: peer = the peer's world rank
    std::int64_t start_ns = 0;
    bool blocks;
    bool counted = false;  // false when the debug check rejected the call
  };
  // Compares the collective with the other ranks' in debug mode (see set_debug_checks).
  void check_call(int call, std::size_t elements, int root);
  // The typed collectives' one body each: checks, counts (`call` as in OpGuard), runs.
  template <bool Max, typename T>
  void reduce(std::span<T> x, int call);
  template <typename T>
  void gather(std::span<const T> in, std::span<T> out, int call);
  template <typename T>
  void exchange(std::span<const T> in, std::span<T> out, int call);
  // all_to_allv's debug check: every rank's send counts against its peers' receive counts.
  void check_counts(std::span<const std::int64_t> send_counts,
                    std::span<const std::int64_t> recv_counts);
  std::uint64_t collective_seq_ = 0;
  // Point-to-point operations per peer (group rank): the watchdog's sequence numbers.
  std::vector<std::uint64_t> sent_, received_;

  int rank_;
  std::vector<int> world_ranks_;
  std::string name_;
  std::array<CommCounter, kNumCommOps> counters_{};
  CommObservers observers_;
  bool debug_checks_ = false;
};

}  // namespace meshtrain
