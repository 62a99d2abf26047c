// bench/allreduce_bench.cpp — all-reduce, reduce-scatter and all-gather bus bandwidth of
// meshtrain's MPI ProcessGroup by message size, to choose parallel.bucket_mib and to compare
// tensor parallelism's all-reduces with sequence parallelism's reduce-scatter + all-gather by
// measurement (a benchmark, not a test).
//
//   mpirun -np 2 build/bench/allreduce_bench [max_mib]
//   (as root: with OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
//
// Bus bandwidth as nccl-tests defines it: algorithm bandwidth D/t × 2(N−1)/N (the bytes a ring
// all-reduce moves per rank; Patarasuk & Yuan 2009). Each size: one call timed on rank 0 fixes a
// repeat count worth ≈ 0.2 s (broadcast, so every rank makes the same calls); the median of 5
// windows is printed. Messages go through ProcessGroup::all_reduce_sum, so above 4 MiB they are
// sent in 4 MiB chunks; `raw` also shows a single MPI_Allreduce of the whole message, the behaviour
// the chunking avoids. Reduce-scatter and all-gather are timed on the same full size D (the
// input of reduce-scatter, the output of all-gather), bus bandwidth D/t × (N−1)/N. The last two
// columns are the non-blocking iall_reduce_sum that data-parallel gradient buckets use, posted
// and waited for: `nb msg` on plain memory (MPI_Iallreduce in 4 MiB chunks), `nb shm` on a
// shared-memory window (ProcessGroup::allocate_shared; "-" when the ranks span nodes).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "meshtrain/comm/mpi_runtime.h"

namespace {

// Every rank must make the same number of calls, or the collectives pair up wrongly and hang:
// the count comes from rank 0's timing of one call and is broadcast.
double seconds_per_call(meshtrain::ProcessGroup& world, auto&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  world.broadcast(std::as_writable_bytes(std::span<double>(&once, 1)), 0);
  const int calls = std::max(3, static_cast<int>(0.2 / std::max(once, 1e-7)));
  std::vector<double> windows;
  for (int w = 0; w < 5; ++w) {
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    windows.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      calls);
  }
  std::sort(windows.begin(), windows.end());
  return windows[2];
}

}  // namespace

int main(int argc, char** argv) {
  meshtrain::MpiRuntime runtime(&argc, &argv);
  const auto world = runtime.world_group();
  const int n = world->size();
  const std::int64_t max_mib = argc > 1 ? std::atoll(argv[1]) : 64;
  if (world->rank() == 0) {
    std::printf(
        "over %d ranks: size, bus bandwidth GB/s of all-reduce (ProcessGroup, chunked), "
        "raw single MPI_Allreduce, reduce-scatter, all-gather, iall_reduce_sum by messages "
        "(nb msg) and on a shared-memory window (nb shm)\n",
        n);
  }
  for (std::int64_t bytes = 64 << 10; bytes <= (max_mib << 20); bytes *= 2) {
    std::vector<float> x(static_cast<std::size_t>(bytes / 4), 1.0f);
    const double t_pg = seconds_per_call(*world, [&] { world->all_reduce_sum(x); });
    const double t_raw = seconds_per_call(*world, [&] {
      MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    });
    std::vector<float> part(x.size() / static_cast<std::size_t>(n));
    const double t_rs = seconds_per_call(*world, [&] { world->reduce_scatter_sum(x, part); });
    const double t_ag = seconds_per_call(*world, [&] { world->all_gather(part, x); });
    const double t_nb = seconds_per_call(*world, [&] { world->iall_reduce_sum(x)->wait(); });
    meshtrain::Tensor shared =
        world->allocate_shared(static_cast<std::int64_t>(x.size()), meshtrain::MemCategory::comm);
    double t_shm = 0.0;
    if (shared.defined()) {
      shared.fill(1.0f);
      t_shm = seconds_per_call(*world, [&] { world->iall_reduce_sum(shared.span_f32())->wait(); });
    }
    const double factor = 2.0 * (n - 1) / n;
    const double half = static_cast<double>(n - 1) / n;
    const auto d = static_cast<double>(bytes);
    if (world->rank() == 0) {
      std::printf("%8.2f MiB  %6.2f GB/s  %6.2f GB/s  %6.2f GB/s  %6.2f GB/s  %6.2f GB/s  ",
                  d / (1 << 20), factor * d / t_pg / 1e9, factor * d / t_raw / 1e9,
                  half * d / t_rs / 1e9, half * d / t_ag / 1e9, factor * d / t_nb / 1e9);
      if (shared.defined()) {
        std::printf("%6.2f GB/s\n", factor * d / t_shm / 1e9);
      } else {
        std::printf("     -\n");
      }
    }
  }
  return 0;
}
