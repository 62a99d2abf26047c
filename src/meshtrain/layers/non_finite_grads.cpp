#include "meshtrain/layers/non_finite_grads.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/kernels/kernels.h"

namespace meshtrain {

void NonFiniteGradWatch::check(const Parameter& p, std::span<const float> values,
                               std::int64_t offset, GradReduction reduction, std::string_view op,
                               const ProcessGroup& group) {
  if (first_ || kernels::all_finite(values.data(), static_cast<std::int64_t>(values.size()))) {
    return;
  }
  // Rare: only a step that is about to fail comes here, so the second pass costs nothing.
  const auto bad =
      std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
  note(p, offset + (bad - values.begin()), *bad, reduction, op, group);
}

void NonFiniteGradWatch::note(const Parameter& p, std::int64_t element, float value,
                              GradReduction reduction, std::string_view op,
                              const ProcessGroup& group) {
  if (first_) return;
  first_ = NonFiniteGrad{.param = &p,
                         .element = element,
                         .value = value,
                         .reduction = reduction,
                         .before = fmt::format("the {} over {}", op, group.name())};
}

}  // namespace meshtrain
