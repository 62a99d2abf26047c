// src/meshtrain/layers/parameter.h
//
// A trainable tensor with its Hugging Face name, its gradient and how it is initialised.
// Initial values come from Philox keyed by (seed, name, global element index) (DESIGN
// invariant 1), so they never depend on the layout: a tensor-parallel shard is, bit for bit,
// the matching slice of the unsharded parameter.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/core/tensor.h"
#include "meshtrain/mesh/placement.h"
#include "meshtrain/mesh/shard_slice.h"

namespace meshtrain {

enum class InitKind : std::uint8_t { normal, zeros, ones };

/// Whether a new Parameter allocates its value and grad. Deferred: neither, and initialize()
/// leaves it alone; ZeRO-3 then materialises only each rank's slice (initialize_range), so no
/// rank ever holds the whole model (PyTorch's meta-device initialisation for FSDP plays the
/// same role), and a parameter table (names, shapes, shards) costs no values. An explicit
/// build option of the layers, CausalLm and PipelineStage.
enum class ParameterStorage : std::uint8_t { allocated, deferred };

/// A trainable tensor of this rank. Where it lives on the mesh is `placement`, its record of
/// the placement table (mesh/placement.h), from which the layer allocated it; every consumer
/// (gradient reduction, ZeRO, the grad norm, checkpoints, export) reads the record.
struct Parameter {
  std::string name;  // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  // f32, MemCategory::params, local shape of `shard`. Under mixed precision the trainer may
  // replace it by a bf16 or f16 tensor of the same shape (keeping the f32 master copy itself);
  // layers read it by its dtype (layers/autocast.h).
  Tensor value;
  Tensor grad;  // f32 always, same shape, MemCategory::grads; ACCUMULATED by backward
  InitKind init = InitKind::zeros;
  float init_std = 0.0f;      // for InitKind::normal
  bool weight_decay = false;  // nanoGPT's rule: 2-D weights decay, biases and norms do not
  ShardSlice shard;           // this rank's slice of the logical tensor: placement's tp slice
  // Its record of the placement table; built from a name and a shape or slice instead: name
  // and logical shape, tp from `shard`, every other axis replicated, dense replicas, ZeRO
  // stage 0.
  ParamPlacement placement;

  /// This rank's part of `record`'s tensor: record.tp_slice(tp_rank, tp_size), i.e. the whole
  /// tensor unless the record shards it over tp; placement = record. Value set by
  /// initialize(), grad zeroed (neither allocated when `storage` is deferred).
  Parameter(const ParamPlacement& record, int tp_rank, int tp_size, InitKind init,
            float init_std = 0.0f, ParameterStorage storage = ParameterStorage::allocated);

  /// The whole logical tensor of `shape`; value set by initialize(), grad zeroed (neither
  /// allocated when `storage` is deferred).
  Parameter(std::string name, Shape shape, InitKind init, float init_std = 0.0f,
            ParameterStorage storage = ParameterStorage::allocated);
  /// A shard (see ShardSlice); value set by initialize(), grad zeroed (neither allocated when
  /// `storage` is deferred). MT_CHECKs the slice.
  Parameter(std::string name, ShardSlice shard, InitKind init, float init_std = 0.0f,
            ParameterStorage storage = ParameterStorage::allocated);

  /// True when this rank holds less than the whole logical tensor (sharded over tp); false
  /// for a parameter replicated over tp, whose copies must stay bit-identical (or, under
  /// sequence parallelism, are summed over tp: parallel/tp/replicated_grads.h).
  bool is_sharded() const;
  /// Elements of the logical tensor (padding excluded).
  std::int64_t logical_numel() const;
  /// The shape of this rank's tensor (value's shape when allocated).
  Shape local_shape() const;
};

/// Sets p.value from (seed, p.name, global element index in the logical tensor), so a shard's
/// values are bit for bit the matching slice of the unsharded parameter; padding is zero.
void initialize(Parameter& p, std::uint64_t seed);
/// out [end − begin] f32 ← elements [begin, end) of the flattened local tensor initialize()
/// would produce (same values, bit for bit, whatever the range).
void initialize_range(const Parameter& p, std::uint64_t seed, std::int64_t begin, std::int64_t end,
                      float* out);

/// out [end − begin] f32 ← elements [begin, end) of p's flattened local tensor taken from
/// `logical` (f32, shape p.shard.logical_shape: the whole parameter, e.g. read from a file):
/// the shard's real elements are copied through runs_of(p.shard), padding is zero. The same
/// layout as initialize_range, so an import can stand where initialisation stands.
/// MT_CHECKs the shape and dtype of `logical` (the caller validated the file before).
void copy_range_from_logical(const Parameter& p, const Tensor& logical, std::int64_t begin,
                             std::int64_t end, float* out);

using ParameterList = std::vector<Parameter*>;

/// The part of one parameter this rank's optimizer updates: elements [begin, end) of the
/// parameter's flattened local tensor (its tp shard, row-major). Without ZeRO that is all of
/// it; under ZeRO the data-parallel ranks split it (parallel/dp/zero.h).
struct OptimizerShard {
  Parameter* param = nullptr;  // name, weight decay, tp sharding, placement
  std::int64_t begin = 0;
  std::int64_t end = 0;  // begin == end: this rank owns none of it
  Tensor master;         // f32 [end − begin]: the fp32 weights the optimizer steps
  Tensor grad;           // f32 [end − begin]: the gradient the optimizer reads
};
using OptimizerShards = std::vector<OptimizerShard>;

/// Whole-parameter shards of fp32 parameters: master and grad are flat views of p.value and
/// p.grad (no copy), so stepping them updates the parameters in place.
OptimizerShards whole_shards(const ParameterList& params);

}  // namespace meshtrain
