#include "meshtrain/checkpoint/finite_values.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/core/error.h"

namespace meshtrain {

std::int64_t first_non_finite(std::span<const float> values) noexcept {
  const auto it =
      std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
  return it == values.end() ? -1 : static_cast<std::int64_t>(it - values.begin());
}

void throw_non_finite(std::string_view where, std::string_view tensor, std::int64_t element,
                      float value, std::string_view advice) {
  throw DataError(fmt::format("{}: tensor {} holds a non-finite value ({}) at element {}: {}",
                              where, tensor, value, element, advice));
}

void require_finite(std::span<const float> values, std::string_view where, std::string_view tensor,
                    std::string_view advice) {
  if (const std::int64_t i = first_non_finite(values); i >= 0) {
    throw_non_finite(where, tensor, i, values[static_cast<std::size_t>(i)], advice);
  }
}

}  // namespace meshtrain
