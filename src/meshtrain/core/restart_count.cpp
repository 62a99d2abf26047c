#include "meshtrain/core/restart_count.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

namespace meshtrain {
namespace {

// A count from the environment: its value when it is a whole number > 0, else 0.
int count_from_env(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  const bool whole = end != text && *end == '\0';
  return whole && value > 0 && value < std::numeric_limits<int>::max() ? static_cast<int>(value)
                                                                       : 0;
}

}  // namespace

int restart_count_from_env() {
  return std::max(count_from_env(kRestartCountEnv), count_from_env("SLURM_RESTART_COUNT"));
}

}  // namespace meshtrain
