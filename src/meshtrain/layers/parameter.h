// src/meshtrain/layers/parameter.h
//
// A trainable tensor with its Hugging Face name, its gradient and how it is initialised.
// Initial values come from Philox keyed by (seed, name, global element index) (DESIGN
// invariant 1), so they never depend on the layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/tensor.h"

namespace meshtrain {

enum class InitKind : std::uint8_t { normal, zeros, ones };

struct Parameter {
  std::string name;  // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  Tensor value;      // f32, MemCategory::params
  Tensor grad;       // f32, same shape, MemCategory::grads; ACCUMULATED by backward
  InitKind init = InitKind::zeros;
  float init_std = 0.0f;      // for InitKind::normal
  bool weight_decay = false;  // nanoGPT's rule: 2-D weights decay, biases and norms do not

  /// Allocates value and grad of `shape` (grad zeroed; value set by initialize()).
  Parameter(std::string name, Shape shape, InitKind init, float init_std = 0.0f);
};

/// Sets p.value from (seed, p.name, element index).
void initialize(Parameter& p, std::uint64_t seed);

using ParameterList = std::vector<Parameter*>;

}  // namespace meshtrain
