// src/meshtrain/comm/mpi_runtime.h
//
// MPI start-up and shut-down, and the world/self groups. The only other file that includes
// <mpi.h> is mpi_process_group.cpp: model and trainer code sees ProcessGroup only.
#pragma once

#include <memory>

#include "meshtrain/comm/process_group.h"

namespace meshtrain {

/// Initialises MPI on construction and finalises it on destruction (one per process, created
/// first in main so that every group is destroyed before MPI_Finalize). Installs MPI_Abort as
/// the MT_CHECK abort hook so a broken invariant on one rank stops every rank.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const noexcept { return world_rank_; }
  int world_size() const noexcept { return world_size_; }
  /// Ranks of this job on this node (for choosing compute threads per rank).
  int local_size() const noexcept { return local_size_; }

  /// All ranks of the job (a duplicate of MPI_COMM_WORLD, so its traffic is separate).
  std::unique_ptr<ProcessGroup> world_group() const;
  /// This rank alone: a reference run inside a distributed test uses it.
  std::unique_ptr<ProcessGroup> self_group() const;

 private:
  int world_rank_ = 0;
  int world_size_ = 1;
  int local_size_ = 1;
};

}  // namespace meshtrain
