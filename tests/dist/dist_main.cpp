// tests/dist/dist_main.cpp — GoogleTest main for tests run under `mpirun -np N`: MPI is
// started once for the whole binary; every rank runs every test, and a failure on any rank
// makes mpirun exit non-zero. Only rank 0 prints GoogleTest's progress; the other ranks print
// their failed assertions, so a failure on rank 1 alone is not hidden behind rank 0's PASSED.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "dist_env.h"

namespace meshtrain::test {
namespace {
MpiRuntime* g_runtime = nullptr;
}
MpiRuntime& runtime() { return *g_runtime; }

namespace {
// A failed assertion on a rank other than 0, with the rank and the test it failed in.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // Kept here: UnitTest::current_test_info() would take the lock AddTestPartResult holds.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestEnd(const ::testing::TestInfo&) override { test_ = "(outside a test)"; }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: Failure\n%s\n", rank_, test_.c_str(),
                 result.file_name() != nullptr ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
  std::string test_ = "(outside a test)";
};
}  // namespace
}  // namespace meshtrain::test

int main(int argc, char** argv) {
  meshtrain::MpiRuntime runtime(&argc, &argv);
  meshtrain::test::g_runtime = &runtime;
  ::testing::InitGoogleTest(&argc, argv);
  if (runtime.world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new meshtrain::test::FailurePrinter(runtime.world_rank()));
  }
  const int result = RUN_ALL_TESTS();
  // Agree on the verdict so that every rank exits with the same code.
  auto world = runtime.world_group();
  float failed = result == 0 ? 0.0f : 1.0f;
  world->all_reduce_max(std::span<float>(&failed, 1));
  return failed > 0.0f ? 1 : 0;
}
