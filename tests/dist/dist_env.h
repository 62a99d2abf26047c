// tests/dist/dist_env.h — access to the MPI runtime of a distributed test binary.
#pragma once

#include "meshtrain/comm/mpi_runtime.h"

namespace meshtrain::test {
MpiRuntime& runtime();
}  // namespace meshtrain::test
