// src/meshtrain/comm/mpi_process_group.h — ProcessGroup over an MPI communicator it owns.
// (Build with OMPI_SKIP_MPICXX defined: OpenMPI's deprecated C++ bindings, pulled in by
// <mpi.h>, trip -Wcast-function-type under -Wextra -Werror with GCC 12.)
#pragma once

#include <mpi.h>

#include <memory>
#include <utility>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {

class SharedWindow;

/// Owns one communicator (from MPI_Comm_dup or MPI_Comm_split); frees it exactly once.
class MpiComm {
 public:
  explicit MpiComm(MPI_Comm comm) noexcept : comm_(comm) {}
  MpiComm(MpiComm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  MpiComm& operator=(MpiComm&& other) noexcept {
    std::swap(comm_, other.comm_);
    return *this;
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  ~MpiComm();
  MPI_Comm get() const noexcept { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

class MpiProcessGroup final : public ProcessGroup {
 public:
  /// Takes ownership of `comm`; `axis_name` prefixes the group's name ("world", "dp", ...).
  MpiProcessGroup(MpiComm comm, std::string axis_name);

 private:
  std::unique_ptr<ProcessGroup> do_split(int color, int key, std::string axis_name) const override;
  void do_all_reduce_sum(std::span<float> x) override;
  void do_all_reduce_sum(std::span<double> x) override;
  void do_all_reduce_sum(std::span<std::int32_t> x) override;
  void do_all_reduce_sum(std::span<std::int64_t> x) override;
  void do_all_reduce_max(std::span<float> x) override;
  void do_all_reduce_max(std::span<std::int32_t> x) override;
  void do_broadcast(std::span<std::byte> x, int root) override;
  void do_barrier() override;
  void do_reduce_scatter_sum(std::span<const float> in, std::span<float> out) override;
  void do_all_gather(std::span<const float> in, std::span<float> out) override;
  void do_all_gather(std::span<const std::int32_t> in, std::span<std::int32_t> out) override;
  void do_all_to_all(std::span<const float> in, std::span<float> out) override;
  void do_all_to_all(std::span<const std::int32_t> in, std::span<std::int32_t> out) override;
  void do_all_to_allv(std::span<const float> in, std::span<const std::int64_t> send_counts,
                      std::span<float> out, std::span<const std::int64_t> recv_counts) override;
  void do_send(std::span<const float> x, int peer, int tag) override;
  void do_recv(std::span<float> x, int peer, int tag) override;
  std::unique_ptr<CommRequest> do_isend(std::span<const float> x, int peer, int tag) override;
  std::unique_ptr<CommRequest> do_irecv(std::span<float> x, int peer, int tag) override;
  std::unique_ptr<CommRequest> do_iall_gather(std::span<const float> in,
                                              std::span<float> out) override;
  std::unique_ptr<CommRequest> do_iall_reduce_sum(std::span<float> x, float scale) override;
  std::unique_ptr<CommRequest> do_ireduce_scatter_sum(std::span<float> in,
                                                      std::span<float> out) override;
  Tensor do_allocate_shared(std::int64_t count, MemCategory category) override;

  MpiComm comm_;
  Tensor ring_scratch_;  // reduce-scatter's receive block, grown once, MemCategory::comm
  // ireduce_scatter_sum's rings: their own communicator (so their messages never meet other
  // point-to-point traffic of the group), duplicated at the first call; the last ring's tag.
  MpiComm ring_comm_{MPI_COMM_NULL};
  int ring_tag_ = 0;
  // allocate_shared's windows, found again by iall_reduce_sum (a window lives while a tensor
  // over it does).
  std::vector<std::weak_ptr<SharedWindow>> shared_windows_;
};

}  // namespace meshtrain
