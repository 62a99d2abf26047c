// tests/dist/dist_env.h — access to the MPI runtime of a distributed test binary.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "meshtrain/comm/mpi_runtime.h"

namespace meshtrain::test {
MpiRuntime& runtime();

/// Ranks mpirun launched (OMPI_COMM_WORLD_SIZE; 1 outside mpirun). Readable before MPI starts,
/// so parametrized tests instantiate only the layouts this world size can run.
inline int launched_world_size() {
  const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
  return env != nullptr ? std::atoi(env) : 1;
}

/// The parameter of a suite whose tests need peers: {launched world size} when it is at least
/// `min_ranks`, else {} — such a test is instantiated only at the world sizes it applies to
/// (its suite carries GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST) instead of passing there
/// without checking anything. Instantiate with ::testing::ValuesIn(...) and world_name.
inline std::vector<int> world_of_at_least(int min_ranks) {
  const int n = launched_world_size();
  return n >= min_ranks ? std::vector<int>{n} : std::vector<int>{};
}

/// Test names "np2", "np4", ... for a world-size parameter.
inline std::string world_name(const ::testing::TestParamInfo<int>& info) {
  return "np" + std::to_string(info.param);
}
}  // namespace meshtrain::test
