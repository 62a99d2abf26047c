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

/// Where a rank's tensor sits in the logical parameter: along dimension `dim` it holds
/// [offset, offset + local size) of `logical_shape`, and all of every other dimension
/// (a tensor-parallel shard: dim 0 of [out, in] for column-parallel, dim 1 for row-parallel).
/// An unsharded parameter has offset 0 and logical_shape equal to its own shape.
struct ShardSlice {
  int dim = 0;
  std::int64_t offset = 0;
  Shape logical_shape;
};

struct Parameter {
  std::string name;  // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  Tensor value;      // f32, MemCategory::params
  Tensor grad;       // f32, same shape, MemCategory::grads; ACCUMULATED by backward
  InitKind init = InitKind::zeros;
  float init_std = 0.0f;      // for InitKind::normal
  bool weight_decay = false;  // nanoGPT's rule: 2-D weights decay, biases and norms do not
  ShardSlice shard;           // this rank's slice of the logical tensor

  /// Allocates value and grad of `shape` (grad zeroed; value set by initialize()); the whole
  /// logical tensor.
  Parameter(std::string name, Shape shape, InitKind init, float init_std = 0.0f);
  /// A shard: value and grad have the shape of `shard.logical_shape` with dimension
  /// `shard.dim` cut to `local_size`. MT_CHECKs that the slice lies inside the logical shape.
  Parameter(std::string name, ShardSlice shard, std::int64_t local_size, InitKind init,
            float init_std = 0.0f);

  bool is_sharded() const { return shard.logical_shape != value.shape(); }
};

/// Sets p.value from (seed, p.name, global element index in the logical tensor), so a shard's
/// values are bit for bit the matching slice of the unsharded parameter (DESIGN invariant 1).
void initialize(Parameter& p, std::uint64_t seed);

using ParameterList = std::vector<Parameter*>;

}  // namespace meshtrain
