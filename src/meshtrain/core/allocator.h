// src/meshtrain/core/allocator.h
//
// The tracked allocator: every tensor's memory comes from here, so current and peak bytes per
// category are known per rank (DESIGN invariant 5) and comparable with `plan`'s prediction.
// Freed blocks are cached by exact size and handed out again, because first touch of fresh
// memory costs ≈12 µs per 4 KiB page on the project's machines and a training step frees and
// re-allocates the same activation sizes every step (DESIGN, machine notes).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshtrain {

enum class MemCategory : std::uint8_t { params, grads, optimizer, activations, comm, other };
inline constexpr std::size_t kNumMemCategories = 6;
std::string_view to_string(MemCategory category);

struct MemoryStats {
  std::int64_t current_bytes = 0;  // live (handed-out) bytes
  std::int64_t peak_bytes = 0;     // maximum of current_bytes since the last reset_peaks()
};

/// Process-wide: one rank is one process, and every module allocates through it.
/// Thread-safe (a mutex: allocations happen at layer granularity, not per element).
class TrackedAllocator {
 public:
  static TrackedAllocator& instance();

  /// Returns 64-byte-aligned memory of at least `bytes` (a cached block of the same rounded
  /// size when one is free). Throws std::bad_alloc when the system has none.
  void* allocate(std::size_t bytes, MemCategory category);
  /// Returns a block to the cache. `bytes` and `category` must be those given to allocate().
  void release(void* ptr, std::size_t bytes, MemCategory category) noexcept;
  /// Counts `bytes` of memory this allocator did not hand out (a shared-memory window a
  /// tensor wraps, Tensor::external) under `category`: positive when it comes into use,
  /// the same amount negated when it goes.
  void account(std::int64_t bytes, MemCategory category) noexcept;

  MemoryStats stats(MemCategory category) const;
  /// Live bytes of all categories together, and their peak (not the sum of per-category peaks).
  MemoryStats total() const;
  /// Bytes held in the cache, not handed out.
  std::int64_t cached_bytes() const;
  /// Peak := current for every category and the total.
  void reset_peaks();
  /// Returns every cached block to the system.
  void empty_cache();
  /// Allocations since the process started that the cache could not serve (a fresh block from
  /// the system, whose pages fault in on first touch). A steady training step has none: the
  /// metrics report the per-step delta as `allocator_misses` (docs/observability.md).
  std::int64_t misses() const;

 private:
  TrackedAllocator() = default;
  ~TrackedAllocator();

  mutable std::mutex mutex_;
  std::array<MemoryStats, kNumMemCategories> by_category_{};
  MemoryStats total_{};
  std::int64_t cached_bytes_ = 0;
  std::int64_t misses_ = 0;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks_;  // rounded size -> blocks
};

/// Minor page faults of this process so far (getrusage(RUSAGE_SELF).ru_minflt): first touches
/// of fresh pages, which cost ≈12 µs per 4 KiB page here. The metrics report the per-step delta
/// as `minor_faults`.
std::int64_t process_minor_faults();

/// Tells glibc's malloc to keep the heap memory a process frees (mallopt: M_TRIM_THRESHOLD −1,
/// so no heap's top is given back to the kernel, and M_MMAP_THRESHOLD fixed at 32 MiB, the
/// largest its dynamic threshold reaches): blocks below 32 MiB come from the heaps and their
/// pages stay mapped once touched. Still released: blocks of 32 MiB or more (mmapped each),
/// a per-thread arena's whole 64 MiB heap once its top covers it, and explicit malloc_trim.
/// For the trainer, whose step allocates and frees the same sizes every time: oneDNN's GEMMs
/// at 2 threads allocate and free their packing buffers per call, and with glibc's defaults
/// the heap's top was trimmed (strace: brk shrinking mid-run) and faulted in again, hundreds of
/// page faults in some steps (the metrics' minor_faults; the counts before and after:
/// docs/performance.md, "Figures behind comments in the source"). The process's heap then
/// stays at its peak. Process-wide and not undone. Returns whether malloc took both settings
/// (false under AddressSanitizer, whose allocator answers mallopt with 0).
bool keep_freed_heap_memory();

}  // namespace meshtrain
