#include "meshtrain/comm/mpi_process_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/comm/shared_window.h"
#include "meshtrain/core/env_switch.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// Single MPI calls of 16 MiB and more collapse to ≈0.1–0.3 GB/s between local ranks on the
// project's machines (OpenMPI's temporary buffer pays the first-touch cost), while 1–4 MiB
// messages run at 6–7 GB/s (DESIGN, machine notes): element-wise collectives go in chunks.
constexpr std::size_t kChunkBytes = std::size_t{4} << 20;

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommError(fmt::format("{} failed: {}", what, std::string_view(text, length)));
}

// As above, naming the group the call ran on (its axis name, set as the communicator's MPI
// name by MpiProcessGroup) and this rank in it: with MPI_ERRORS_RETURN a failed peer or link
// becomes this CommError instead of an abort inside MPI.
void check_mpi(int code, const char* what, MPI_Comm comm) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  char name[MPI_MAX_OBJECT_NAME] = {};
  int name_length = 0, rank = -1, size = 0;
  MPI_Comm_get_name(comm, name, &name_length);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  throw CommError(fmt::format("{} failed on group '{}' (rank {} of {}): {}", what,
                              std::string_view(name, name_length), rank, size,
                              std::string_view(text, length)));
}

int count_of(std::size_t n) {
  MT_CHECK(n <= static_cast<std::size_t>(INT_MAX), "message of {} elements exceeds MPI's int", n);
  return static_cast<int>(n);
}

template <typename T>
void chunked_all_reduce(std::span<T> x, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  const std::size_t chunk = kChunkBytes / sizeof(T);
  for (std::size_t begin = 0; begin < x.size(); begin += chunk) {
    const std::size_t n = std::min(chunk, x.size() - begin);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, x.data() + begin, count_of(n), type, op, comm),
              "MPI_Allreduce", comm);
  }
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> mine(static_cast<std::size_t>(size));
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Allgather(&world_rank, 1, MPI_INT, mine.data(), 1, MPI_INT, comm);
  return mine;
}

int rank_of(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

}  // namespace

MpiComm::~MpiComm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

MpiProcessGroup::MpiProcessGroup(MpiComm comm, std::string axis_name)
    : ProcessGroup(rank_of(comm.get()), world_ranks_of(comm.get()), std::move(axis_name)),
      comm_(std::move(comm)) {
  // Errors come back as codes (check_mpi turns them into CommErrors naming this group); a
  // communicator inherits its parent's handler, set again here so that no group depends on it.
  MPI_Comm_set_errhandler(comm_.get(), MPI_ERRORS_RETURN);
  MPI_Comm_set_name(comm_.get(), name().c_str());
}

std::unique_ptr<ProcessGroup> MpiProcessGroup::do_split(int color, int key,
                                                        std::string axis_name) const {
  MPI_Comm out = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_.get(), color, key, &out), "MPI_Comm_split");
  return std::make_unique<MpiProcessGroup>(MpiComm(out), std::move(axis_name));
}

void MpiProcessGroup::do_all_reduce_sum(std::span<float> x) {
  chunked_all_reduce(x, MPI_FLOAT, MPI_SUM, comm_.get());
}
void MpiProcessGroup::do_all_reduce_sum(std::span<double> x) {
  chunked_all_reduce(x, MPI_DOUBLE, MPI_SUM, comm_.get());
}
void MpiProcessGroup::do_all_reduce_sum(std::span<std::int32_t> x) {
  chunked_all_reduce(x, MPI_INT32_T, MPI_SUM, comm_.get());
}
void MpiProcessGroup::do_all_reduce_sum(std::span<std::int64_t> x) {
  chunked_all_reduce(x, MPI_INT64_T, MPI_SUM, comm_.get());
}
void MpiProcessGroup::do_all_reduce_max(std::span<float> x) {
  chunked_all_reduce(x, MPI_FLOAT, MPI_MAX, comm_.get());
}
void MpiProcessGroup::do_all_reduce_max(std::span<std::int32_t> x) {
  chunked_all_reduce(x, MPI_INT32_T, MPI_MAX, comm_.get());
}

void MpiProcessGroup::do_broadcast(std::span<std::byte> x, int root) {
  check_mpi(MPI_Bcast(x.data(), count_of(x.size()), MPI_BYTE, root, comm_.get()), "MPI_Bcast", comm_.get());
}

void MpiProcessGroup::do_barrier() { check_mpi(MPI_Barrier(comm_.get()), "MPI_Barrier", comm_.get()); }

// A ring reduce-scatter (Patarasuk & Yuan 2009, §3) of N−1 MPI_Sendrecv steps into a scratch
// block that lives as long as the group, instead of MPI_Reduce_scatter_block: OpenMPI 4.1's
// algorithms for it all allocate a temporary buffer per call and ran at 0.6–0.9 GB/s bus
// bandwidth for 0.5–8 MiB between 2 local ranks, against 5–7 GB/s for all-reduce and all-gather
// of the same size (bench/allreduce_bench; docs/performance.md). At step s rank r sends its
// running sum of block (r − 1 − s) mod N to r + 1 and adds its own input to the block
// (r − 2 − s) mod N received from r − 1; after N − 1 steps it holds the full sum of block r.
// Sum order per block is fixed by the ring, so results do not depend on timing.
void MpiProcessGroup::do_reduce_scatter_sum(std::span<const float> in, std::span<float> out) {
  const int n = size(), r = rank();
  const std::size_t block = out.size();
  if (ring_scratch_.numel() < static_cast<std::int64_t>(block)) {
    ring_scratch_ = Tensor();  // the old block first: never both alive at once
    ring_scratch_ = Tensor::empty({static_cast<std::int64_t>(block)}, MemCategory::comm);
  }
  float* recv = ring_scratch_.f32();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto input = [&](int b) { return in.data() + static_cast<std::size_t>((b % n + n) % n) * block; };
  const float* send = input(r - 1);
  for (int s = 0; s < n - 1; ++s) {
    for (std::size_t begin = 0; begin < block; begin += kChunkBytes / sizeof(float)) {
      const std::size_t count = std::min(kChunkBytes / sizeof(float), block - begin);
      check_mpi(MPI_Sendrecv(send + begin, count_of(count), MPI_FLOAT, next, s, recv + begin,
                             count_of(count), MPI_FLOAT, prev, s, comm_.get(), MPI_STATUS_IGNORE),
                "MPI_Sendrecv (reduce-scatter)", comm_.get());
    }
    const float* mine = input(r - 2 - s);
    for (std::size_t i = 0; i < block; ++i) out[i] = mine[i] + recv[i];
    send = out.data();
  }
}

namespace {

template <typename T>
void all_gather_of(std::span<const T> in, std::span<T> out, MPI_Datatype type, MPI_Comm comm) {
  check_mpi(MPI_Allgather(in.data(), count_of(in.size()), type, out.data(), count_of(in.size()),
                          type, comm),
            "MPI_Allgather", comm);
}

template <typename T>
void all_to_all_of(std::span<const T> in, std::span<T> out, int ranks, MPI_Datatype type,
                   MPI_Comm comm) {
  const int per_rank = count_of(in.size() / static_cast<std::size_t>(ranks));
  check_mpi(MPI_Alltoall(in.data(), per_rank, type, out.data(), per_rank, type, comm),
            "MPI_Alltoall", comm);
}

}  // namespace

void MpiProcessGroup::do_all_gather(std::span<const float> in, std::span<float> out) {
  all_gather_of(in, out, MPI_FLOAT, comm_.get());
}
void MpiProcessGroup::do_all_gather(std::span<const std::int32_t> in, std::span<std::int32_t> out) {
  all_gather_of(in, out, MPI_INT32_T, comm_.get());
}

void MpiProcessGroup::do_all_to_all(std::span<const float> in, std::span<float> out) {
  all_to_all_of(in, out, size(), MPI_FLOAT, comm_.get());
}
void MpiProcessGroup::do_all_to_all(std::span<const std::int32_t> in, std::span<std::int32_t> out) {
  all_to_all_of(in, out, size(), MPI_INT32_T, comm_.get());
}

void MpiProcessGroup::do_all_to_allv(std::span<const float> in,
                                     std::span<const std::int64_t> send_counts,
                                     std::span<float> out,
                                     std::span<const std::int64_t> recv_counts) {
  const auto n = static_cast<std::size_t>(size());
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  std::int64_t s_at = 0, r_at = 0;
  for (std::size_t r = 0; r < n; ++r) {
    sc[r] = count_of(static_cast<std::size_t>(send_counts[r]));
    rc[r] = count_of(static_cast<std::size_t>(recv_counts[r]));
    sd[r] = count_of(static_cast<std::size_t>(s_at));
    rd[r] = count_of(static_cast<std::size_t>(r_at));
    s_at += send_counts[r];
    r_at += recv_counts[r];
  }
  check_mpi(MPI_Alltoallv(in.data(), sc.data(), sd.data(), MPI_FLOAT, out.data(), rc.data(),
                          rd.data(), MPI_FLOAT, comm_.get()),
            "MPI_Alltoallv", comm_.get());
}

void MpiProcessGroup::do_send(std::span<const float> x, int peer, int tag) {
  check_mpi(MPI_Send(x.data(), count_of(x.size()), MPI_FLOAT, peer, tag, comm_.get()), "MPI_Send", comm_.get());
}

void MpiProcessGroup::do_recv(std::span<float> x, int peer, int tag) {
  check_mpi(
      MPI_Recv(x.data(), count_of(x.size()), MPI_FLOAT, peer, tag, comm_.get(), MPI_STATUS_IGNORE),
      "MPI_Recv", comm_.get());
}

namespace {
class MpiRequest final : public CommRequest {
 public:
  explicit MpiRequest(MPI_Request request) : request_(request) {}
  ~MpiRequest() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }

 private:
  MPI_Request request_;
};
}  // namespace

std::unique_ptr<CommRequest> MpiProcessGroup::do_isend(std::span<const float> x, int peer,
                                                       int tag) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(x.data(), count_of(x.size()), MPI_FLOAT, peer, tag, comm_.get(), &request),
            "MPI_Isend", comm_.get());
  return std::make_unique<MpiRequest>(request);
}

std::unique_ptr<CommRequest> MpiProcessGroup::do_irecv(std::span<float> x, int peer, int tag) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(x.data(), count_of(x.size()), MPI_FLOAT, peer, tag, comm_.get(), &request),
            "MPI_Irecv", comm_.get());
  return std::make_unique<MpiRequest>(request);
}

// ---------------------------------------------------------------------------------------------

namespace {
void abort_all_ranks() { MPI_Abort(MPI_COMM_WORLD, 3); }
}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  // MPI's default, MPI_ERRORS_ARE_FATAL, aborts the whole job from inside the failing call with
  // MPI's own message; returned codes become CommErrors with the operation and group (issue 17).
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  set_abort_hook(&abort_all_ranks);
}

MpiRuntime::~MpiRuntime() {
  set_abort_hook(nullptr);
  MPI_Finalize();
}

std::unique_ptr<ProcessGroup> MpiRuntime::world_group() const {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  return std::make_unique<MpiProcessGroup>(MpiComm(comm), "world");
}

std::unique_ptr<ProcessGroup> MpiRuntime::self_group() const {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_SELF, &comm), "MPI_Comm_dup");
  return std::make_unique<MpiProcessGroup>(MpiComm(comm), "self");
}

std::unique_ptr<CommRequest> MpiProcessGroup::do_iall_gather(std::span<const float> in,
                                                             std::span<float> out) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(in.data(), count_of(in.size()), MPI_FLOAT, out.data(),
                           count_of(in.size()), MPI_FLOAT, comm_.get(), &request),
            "MPI_Iallgather", comm_.get());
  return std::make_unique<MpiRequest>(request);
}

namespace {
// The chunks of one non-blocking all-reduce: complete when all are, and then x ← scale · x
// once. MPI_Testall lets OpenMPI move every chunk's schedule forward (libnbc progresses inside
// MPI calls only).
class MpiRequests final : public CommRequest {
 public:
  MpiRequests(std::vector<MPI_Request> requests, std::span<float> x, float scale)
      : requests_(std::move(requests)), x_(x), scale_(scale) {}
  ~MpiRequests() override {
    MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    check_mpi(
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall");
    finish();
  }
  bool test() override {
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                          MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (done != 0) finish();
    return done != 0;
  }

 private:
  void finish() {
    if (scaled_ || scale_ == 1.0f) return;
    for (float& v : x_) v *= scale_;
    scaled_ = true;
  }

  std::vector<MPI_Request> requests_;  // MPI_REQUEST_NULL once complete
  std::span<float> x_;
  float scale_;
  bool scaled_ = false;
};
}  // namespace

Tensor MpiProcessGroup::do_allocate_shared(std::int64_t count, MemCategory category) {
  // Read before any collective, so that a bad value throws on every rank alike; the switch
  // joins the MIN below, so ranks that disagree all take the messages, none hangs.
  const bool wanted = env_switch(kShmAllReduceEnv, true);
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm_.get(), MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node),
            "MPI_Comm_split_type", comm_.get());
  MpiComm owned(node);
  int node_size = 0;
  check_mpi(MPI_Comm_size(node, &node_size), "MPI_Comm_size", comm_.get());
  // Every member must take the same path: a window only when the whole group is one node (and
  // the buffer is small enough for SharedWindow's 32-bit non-finite index).
  const bool fits = static_cast<std::uint64_t>(count) < (std::uint64_t{1} << 32);
  int all_here = wanted && fits && node_size == size() ? 1 : 0;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all_here, 1, MPI_INT, MPI_MIN, comm_.get()),
            "MPI_Allreduce", comm_.get());
  if (all_here == 0) return {};
  auto window = std::make_shared<SharedWindow>(node, static_cast<std::size_t>(count));
  shared_windows_.erase(std::remove_if(shared_windows_.begin(), shared_windows_.end(),
                                       [](const auto& w) { return w.expired(); }),
                        shared_windows_.end());
  shared_windows_.push_back(window);
  float* data = window->mine().data();
  return Tensor::external(data, {count}, category, std::move(window));
}

std::unique_ptr<CommRequest> MpiProcessGroup::do_iall_reduce_sum(std::span<float> x,
                                                                 float scale) {
  for (const std::weak_ptr<SharedWindow>& w : shared_windows_) {
    const std::shared_ptr<SharedWindow> window = w.lock();
    if (window && window->mine().data() == x.data() && window->count() == x.size()) {
      return window->iall_reduce_sum(scale);
    }
  }
  // The same chunks as the blocking all-reduce, all posted at once (MPI allows several
  // outstanding non-blocking collectives on a communicator; they complete in any order).
  const std::size_t chunk = kChunkBytes / sizeof(float);
  std::vector<MPI_Request> requests;
  requests.reserve((x.size() + chunk - 1) / chunk);
  for (std::size_t begin = 0; begin < x.size(); begin += chunk) {
    const std::size_t n = std::min(chunk, x.size() - begin);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, x.data() + begin, count_of(n), MPI_FLOAT, MPI_SUM,
                             comm_.get(), &request),
              "MPI_Iallreduce", comm_.get());
    requests.push_back(request);
  }
  return std::make_unique<MpiRequests>(std::move(requests), x, scale);
}

namespace {
// The ring of do_reduce_scatter_sum as a non-blocking request. Step s posts its chunks (Irecv
// from r − 1, Isend to r + 1) and, once all have completed, adds this rank's input block to
// what arrived and posts step s + 1: the additions between steps are ours, so test() and
// wait() run them (MPI's progress engine cannot). The blocking ring's scratch block is not
// needed: step 0 receives into `out` (out = mine + out: the same operands as mine + scratch),
// and later steps into input block r − 1, which step 0 sent and no later step reads (step s
// reads block r − 2 − s, s ≤ N − 2). One tag per request, so that two rings in flight never
// match each other's messages; a ring's own steps are ordered by MPI's non-overtaking rule.
class RingReduceScatter final : public CommRequest {
 public:
  RingReduceScatter(std::span<float> in, std::span<float> out, int rank, int size, MPI_Comm comm,
                    int tag)
      : in_(in), out_(out), rank_(rank), size_(size), comm_(comm), tag_(tag) {
    post_step();
  }
  ~RingReduceScatter() override {
    try {
      wait();
    } catch (...) {  // a destructor must not throw; MPI has reported the failure already
    }
  }
  void wait() override {
    while (!done_) {
      check_mpi(
          MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
          "MPI_Waitall (reduce-scatter)");
      finish_step();
    }
  }
  bool test() override {
    while (!done_) {
      int arrived = 0;
      check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &arrived,
                            MPI_STATUSES_IGNORE),
                "MPI_Testall (reduce-scatter)");
      if (arrived == 0) return false;
      finish_step();
    }
    return true;
  }

 private:
  float* block(int b) {
    return in_.data() + static_cast<std::size_t>((b % size_ + size_) % size_) * out_.size();
  }
  float* receive_space() { return step_ == 0 ? out_.data() : block(rank_ - 1); }
  void post_step() {
    const float* send = step_ == 0 ? block(rank_ - 1) : out_.data();
    float* recv = receive_space();
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const std::size_t chunk = kChunkBytes / sizeof(float);
    for (std::size_t begin = 0; begin < out_.size(); begin += chunk) {
      const int count = count_of(std::min(chunk, out_.size() - begin));
      MPI_Request r = MPI_REQUEST_NULL, s = MPI_REQUEST_NULL;
      check_mpi(MPI_Irecv(recv + begin, count, MPI_FLOAT, prev, tag_, comm_, &r), "MPI_Irecv", comm_);
      requests_.push_back(r);
      check_mpi(MPI_Isend(send + begin, count, MPI_FLOAT, next, tag_, comm_, &s), "MPI_Isend", comm_);
      requests_.push_back(s);
    }
  }
  void finish_step() {
    const float* mine = block(rank_ - 2 - step_);
    const float* recv = receive_space();
    float* out = out_.data();
    for (std::size_t i = 0; i < out_.size(); ++i) out[i] = mine[i] + recv[i];
    requests_.clear();
    if (++step_ == size_ - 1) {
      done_ = true;
    } else {
      post_step();
    }
  }

  std::span<float> in_, out_;
  int rank_, size_;
  MPI_Comm comm_;
  int tag_;
  int step_ = 0;
  bool done_ = false;
  std::vector<MPI_Request> requests_;  // the current step's chunks (MPI_REQUEST_NULL: done)
};
}  // namespace

std::unique_ptr<CommRequest> MpiProcessGroup::do_ireduce_scatter_sum(std::span<float> in,
                                                                     std::span<float> out) {
  if (ring_comm_.get() == MPI_COMM_NULL) {
    // Collective over the group, at the same call on every rank (the posting order rule).
    MPI_Comm dup = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(comm_.get(), &dup), "MPI_Comm_dup");
    ring_comm_ = MpiComm(dup);
  }
  // Tags cycle through [0, 32768) (MPI guarantees MPI_TAG_UB ≥ 32767); far more rings than
  // ever are in flight at once.
  ring_tag_ = (ring_tag_ + 1) % 32768;
  return std::make_unique<RingReduceScatter>(in, out, rank(), size(), ring_comm_.get(), ring_tag_);
}

}  // namespace meshtrain
