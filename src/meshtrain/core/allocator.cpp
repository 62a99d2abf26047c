#include "meshtrain/core/allocator.h"

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace meshtrain {
namespace {
constexpr std::size_t kAlignment = 64;
std::size_t rounded(std::size_t bytes) {
  return std::max<std::size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
}
}  // namespace

std::string_view to_string(MemCategory category) {
  switch (category) {
    case MemCategory::params:
      return "params";
    case MemCategory::grads:
      return "grads";
    case MemCategory::optimizer:
      return "optimizer";
    case MemCategory::activations:
      return "activations";
    case MemCategory::comm:
      return "comm";
    case MemCategory::other:
      return "other";
  }
  return "unknown";
}

TrackedAllocator& TrackedAllocator::instance() {
  static TrackedAllocator allocator;
  return allocator;
}

TrackedAllocator::~TrackedAllocator() { empty_cache(); }

void* TrackedAllocator::allocate(std::size_t bytes, MemCategory category) {
  const std::size_t size = rounded(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto it = free_blocks_.find(size);
    if (it != free_blocks_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= static_cast<std::int64_t>(size);
    } else {
      ++misses_;
    }
  }
  if (ptr == nullptr) {
    ptr = std::aligned_alloc(kAlignment, size);
    if (ptr == nullptr) throw std::bad_alloc();
  }
  account(static_cast<std::int64_t>(size), category);
  return ptr;
}

void TrackedAllocator::account(std::int64_t bytes, MemCategory category) noexcept {
  std::lock_guard lock(mutex_);
  MemoryStats& cat = by_category_[static_cast<std::size_t>(category)];
  cat.current_bytes += bytes;
  cat.peak_bytes = std::max(cat.peak_bytes, cat.current_bytes);
  total_.current_bytes += bytes;
  total_.peak_bytes = std::max(total_.peak_bytes, total_.current_bytes);
}

void TrackedAllocator::release(void* ptr, std::size_t bytes, MemCategory category) noexcept {
  if (ptr == nullptr) return;
  const std::size_t size = rounded(bytes);
  std::lock_guard lock(mutex_);
  by_category_[static_cast<std::size_t>(category)].current_bytes -= static_cast<std::int64_t>(size);
  total_.current_bytes -= static_cast<std::int64_t>(size);
  try {
    free_blocks_[size].push_back(ptr);
    cached_bytes_ += static_cast<std::int64_t>(size);
  } catch (...) {
    std::free(ptr);  // the cache could not grow: give the block back instead
  }
}

MemoryStats TrackedAllocator::stats(MemCategory category) const {
  std::lock_guard lock(mutex_);
  return by_category_[static_cast<std::size_t>(category)];
}

MemoryStats TrackedAllocator::total() const {
  std::lock_guard lock(mutex_);
  return total_;
}

std::int64_t TrackedAllocator::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return cached_bytes_;
}

std::int64_t TrackedAllocator::misses() const {
  std::lock_guard lock(mutex_);
  return misses_;
}

void TrackedAllocator::reset_peaks() {
  std::lock_guard lock(mutex_);
  for (MemoryStats& s : by_category_) s.peak_bytes = s.current_bytes;
  total_.peak_bytes = total_.current_bytes;
}

void TrackedAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  for (auto& [size, blocks] : free_blocks_) {
    for (void* p : blocks) std::free(p);
  }
  free_blocks_.clear();
  cached_bytes_ = 0;
}

std::int64_t process_minor_faults() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::int64_t>(usage.ru_minflt);
}

bool keep_freed_heap_memory() {
  constexpr int kMmapThreshold = 32 << 20;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64 bits
  const bool trim = mallopt(M_TRIM_THRESHOLD, -1) == 1;
  const bool mmap = mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
  return trim && mmap;
}

}  // namespace meshtrain
