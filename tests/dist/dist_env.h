// tests/dist/dist_env.h — access to the MPI runtime of a distributed test binary.
#pragma once

#include <cstdlib>

#include "meshtrain/comm/mpi_runtime.h"

namespace meshtrain::test {
MpiRuntime& runtime();

/// Ranks mpirun launched (OMPI_COMM_WORLD_SIZE; 1 outside mpirun). Readable before MPI starts,
/// so parametrized tests instantiate only the layouts this world size can run.
inline int launched_world_size() {
  const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
  return env != nullptr ? std::atoi(env) : 1;
}
}  // namespace meshtrain::test
