#include "meshtrain/comm/comm_observer.h"

namespace meshtrain {

bool CommObservers::contains(const CommObserver& o) const noexcept {
  for (std::size_t i = 0; i < count_; ++i) {
    if (entries_[i].observer == &o) return true;
  }
  return false;
}

bool CommObservers::add(CommObserver& o, std::uint64_t id) noexcept {
  if (count_ == kMaxCommObservers) return false;
  entries_[count_++] = {.observer = &o, .id = id};
  return true;
}

bool CommObservers::remove(const CommObserver& o) noexcept {
  for (std::size_t i = 0; i < count_; ++i) {
    if (entries_[i].observer != &o) continue;
    for (std::size_t j = i + 1; j < count_; ++j) entries_[j - 1] = entries_[j];
    entries_[--count_] = {};
    return true;
  }
  return false;
}

}  // namespace meshtrain
