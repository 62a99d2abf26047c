#include "meshtrain/layers/parameter.h"

#include "meshtrain/core/rng.h"

namespace meshtrain {

Parameter::Parameter(std::string name_, Shape shape, InitKind init_, float init_std_)
    : name(std::move(name_)),
      value(Tensor::empty(shape, MemCategory::params)),
      grad(Tensor::zeros(shape, MemCategory::grads)),
      init(init_),
      init_std(init_std_),
      weight_decay(shape.size() >= 2) {}

void initialize(Parameter& p, std::uint64_t seed) {
  switch (p.init) {
    case InitKind::normal:
      fill_normal(p.value.span_f32(), seed, stream_of(p.name), 0, 0.0f, p.init_std);
      break;
    case InitKind::zeros:
      p.value.fill(0.0f);
      break;
    case InitKind::ones:
      p.value.fill(1.0f);
      break;
  }
}

}  // namespace meshtrain
