// tests/dist/dist_main.cpp — GoogleTest main for tests run under `mpirun -np N`: MPI is
// started once for the whole binary; every rank runs every test, and a failure on any rank
// makes mpirun exit non-zero. Only rank 0 prints GoogleTest's progress.
#include <gtest/gtest.h>

#include "dist_env.h"

namespace meshtrain::test {
namespace {
MpiRuntime* g_runtime = nullptr;
}
MpiRuntime& runtime() { return *g_runtime; }
}  // namespace meshtrain::test

int main(int argc, char** argv) {
  meshtrain::MpiRuntime runtime(&argc, &argv);
  meshtrain::test::g_runtime = &runtime;
  ::testing::InitGoogleTest(&argc, argv);
  if (runtime.world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int result = RUN_ALL_TESTS();
  // Agree on the verdict so that every rank exits with the same code.
  auto world = runtime.world_group();
  float failed = result == 0 ? 0.0f : 1.0f;
  world->all_reduce_max(std::span<float>(&failed, 1));
  return failed > 0.0f ? 1 : 0;
}
