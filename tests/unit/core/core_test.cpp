// Tests of core/: the tracked allocator's accounting, Tensor views, and the counter-based RNG
// (DESIGN invariant 1: an element's value depends only on (seed, name, index)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {
namespace {

// The GCC 12 wrong-code case the top-level CMakeLists.txt works around (-fno-tree-slp-vectorize):
// under -march=native on an AVX-512 machine these initialisers came out as one broadcast.
TEST(Toolchain, ConstantInitialisersKeepEveryElement) {
  const std::vector<std::int64_t> a{3, 3, 0, 0};
  EXPECT_EQ(a[2], 0);
  EXPECT_EQ(a[3], 0);
  const std::vector<int> b{3, 3, 3, 3, 0, 0, 0, 0};
  EXPECT_EQ(b[4] + b[5] + b[6] + b[7], 0);
  const std::vector<double> c{3, 3, 0, 0};
  EXPECT_EQ(c[2] + c[3], 0.0);
}

TEST(TrackedAllocator, CountsCurrentAndPeakPerCategoryAndReusesFreedBlocks) {
  TrackedAllocator& alloc = TrackedAllocator::instance();
  alloc.reset_peaks();
  const std::int64_t grads_before = alloc.stats(MemCategory::grads).current_bytes;
  const void* first_ptr = nullptr;
  {
    Tensor a = Tensor::zeros({1000}, MemCategory::grads);  // 4000 bytes, rounded to 4032
    first_ptr = a.f32();
    EXPECT_EQ(alloc.stats(MemCategory::grads).current_bytes - grads_before, 4032);
    Tensor b = Tensor::empty({10, 10}, MemCategory::grads);
    EXPECT_EQ(alloc.stats(MemCategory::grads).current_bytes - grads_before, 4032 + 448);
  }
  EXPECT_EQ(alloc.stats(MemCategory::grads).current_bytes, grads_before);
  EXPECT_EQ(alloc.stats(MemCategory::grads).peak_bytes - grads_before, 4032 + 448);
  Tensor c = Tensor::empty({1000}, MemCategory::activations);
  EXPECT_EQ(c.f32(), first_ptr) << "a freed block of the same size is handed out again";
  EXPECT_EQ(c.category(), MemCategory::activations);
}

// Minor page faults of allocating `count` blocks of `bytes` with malloc, writing every byte and
// freeing them all (the blocks freed last leave the free space at the heap's top). Unused under
// AddressSanitizer (below).
[[maybe_unused]] std::int64_t faults_of_a_malloc_round(int count, std::size_t bytes) {
  const std::int64_t before = process_minor_faults();
  std::vector<void*> blocks;
  for (int i = 0; i < count; ++i) {
    blocks.push_back(std::malloc(bytes));  // NOLINT: the C heap is what is under test
    std::memset(blocks.back(), 1, bytes);
  }
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) std::free(*it);  // NOLINT
  return process_minor_faults() - before;
}

TEST(KeepFreedHeapMemory, BlocksFreedAndAllocatedAgainFaultNoPageInTheSecondTime) {
  // The settings are process-wide and stay for the rest of the process (ctest runs each test
  // in its own). Under a sanitizer or Valgrind with an allocator of its own the test does not
  // apply; the repository's sanitizer build is AddressSanitizer's (scripts/sanitize.sh).
  const bool took = keep_freed_heap_memory();
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer's allocator replaces glibc's and answers mallopt with 0 (not taken).
  EXPECT_FALSE(took);
#else
  ASSERT_TRUE(took);
  // 40 blocks of 3 MiB, below the 32 MiB mmap threshold, so from the heap; freed together
  // they leave 120 MiB free at its top, more than glibc's default trim threshold ever reaches
  // (twice its dynamic mmap threshold, at most 64 MiB): with the defaults the top is given
  // back and the second round faults its ≈ 30,000 pages in again.
  constexpr int kBlocks = 40;
  constexpr std::size_t kBytes = std::size_t{3} << 20;
  const std::int64_t first = faults_of_a_malloc_round(kBlocks, kBytes);
  const std::int64_t second = faults_of_a_malloc_round(kBlocks, kBytes);
  std::printf("minor faults: first round %lld, second %lld\n", static_cast<long long>(first),
              static_cast<long long>(second));
  // Relative bounds: with huge pages (THP "always") a round faults ≈ 60 times, not 30,000.
  ASSERT_GE(first, kBlocks) << "the first round must fault its fresh pages in";
  EXPECT_LE(second, first / 16) << "the pages of the freed blocks were given back to the kernel";
#endif
}

TEST(Tensor, RowsAndReshapeShareStorage) {
  Tensor t = Tensor::zeros({4, 3}, MemCategory::other);
  for (int i = 0; i < 12; ++i) t.f32()[i] = static_cast<float>(i);
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.f32()[0], 3.0f);
  r.f32()[0] = -1.0f;
  EXPECT_EQ(t.f32()[3], -1.0f);
  Tensor v = t.reshape({12});
  EXPECT_EQ(v.dim(-1), 12);
  Tensor c = t.clone();
  c.f32()[0] = 42.0f;
  EXPECT_EQ(t.f32()[0], 0.0f);
}

TEST(Philox, ValueDependsOnlyOnSeedStreamAndIndex) {
  const std::uint64_t stream = stream_of("transformer.h.0.attn.c_attn.weight");
  std::vector<float> whole(64);
  fill_normal(whole, 1337, stream, 0, 0.0f, 0.02f);
  // A shard holding elements [40, 64) of the same logical tensor gets the same values.
  std::vector<float> shard(24);
  fill_normal(shard, 1337, stream, 40, 0.0f, 0.02f);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(shard[i], whole[40 + i]);
  // Another name or seed gives other values.
  EXPECT_NE(philox_normal(1337, stream, 0), philox_normal(1338, stream, 0));
  EXPECT_NE(philox_normal(1337, stream, 0), philox_normal(1337, stream_of("other"), 0));
}

TEST(Philox, NormalHasUnitMomentsOverManyDraws) {
  constexpr int kN = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kN; ++i) {
    const double x = philox_normal(7, 11, static_cast<std::uint64_t>(i));
    sum += x;
    sum_sq += x * x;
  }
  // Standard errors: mean 1/√N ≈ 0.0022, variance √(2/N) ≈ 0.0032; 5 sigma bounds.
  EXPECT_NEAR(sum / kN, 0.0, 0.012);
  EXPECT_NEAR(sum_sq / kN, 1.0, 0.016);
}

TEST(ConfigError, RendersEverySettingValueRuleAndFix) {
  const ConfigError error("configs/x.toml", {{"parallel.dp", "3", "must divide 12", "use 2"},
                                             {"model.n_head", "5", "must divide 128", "use 4"}});
  const std::string what = error.what();
  EXPECT_NE(what.find("has 2 problems"), std::string::npos);
  EXPECT_NE(what.find("parallel.dp = 3"), std::string::npos);
  EXPECT_NE(what.find("rule: must divide 128"), std::string::npos);
  EXPECT_NE(what.find("fix:  use 2"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain
