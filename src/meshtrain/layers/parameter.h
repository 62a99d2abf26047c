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

namespace meshtrain {

enum class InitKind : std::uint8_t { normal, zeros, ones };

/// Where a rank's tensor sits in the logical parameter. Dimension `dim` of the logical tensor
/// is `parts` equal consecutive blocks (1 normally; 3 for GPT-2's fused c_attn [q; k; v], whose
/// shard must hold the same heads of q, k and v). In every block the rank holds logical indices
/// [offset, offset + length) and stores them as the first `length` of `stride` consecutive
/// entries of its own dimension `dim`; entries [length, stride) are padding (a vocabulary not
/// divisible by tp), always zero, never part of the logical tensor. Every other dimension is
/// whole. Local shape = logical shape with dimension `dim` set to parts·stride.
struct ShardSlice {
  int dim = 0;
  std::int64_t parts = 1;
  std::int64_t offset = 0;
  std::int64_t length = 0;
  std::int64_t stride = 0;
  Shape logical_shape;

  bool operator==(const ShardSlice&) const = default;
};

/// The whole of `logical` (a parameter replicated over its group).
ShardSlice whole(const Shape& logical);

/// Megatron-LM's even split (Shoeybi et al. 2019, §3): each of the `parts` blocks of dimension
/// `dim` (n entries each) is cut into `ranks` pieces of ceil(n / ranks); rank r holds
/// [r·piece, min((r+1)·piece, n)) padded to `piece` entries. So every rank's tensor has the
/// same shape, only the last ranks carry padding, and without padding it is the plain slice.
/// MT_CHECKs 0 ≤ rank < ranks and that `parts` divides the dimension.
ShardSlice even_shard(const Shape& logical, int dim, int rank, int ranks, std::int64_t parts = 1);

/// A contiguous run of a shard's real (non-padding) elements: `count` elements starting at
/// element `local` of the rank's tensor and at element `logical` of the logical tensor
/// (row-major numbering of each).
struct ShardRun {
  std::int64_t local;
  std::int64_t logical;
  std::int64_t count;
};
/// Every run of `slice`, in increasing local order; together they cover each real element once.
std::vector<ShardRun> runs_of(const ShardSlice& slice);

/// The ranks that hold the same elements of a parameter and see different tokens: its gradient
/// is reduced over them, its optimizer state ZeRO-sliced over them, and one of them counts its
/// elements in the grad norm and saves them (layers/placement.h).
enum class ReplicaGroup : std::uint8_t {
  dense,   // dp × cp: every weight outside the experts (grad_reduction_group)
  expert,  // expert data parallel, (dp·cp)/ep ranks: an expert's weights, which the other ep
           // ranks of its dp × cp group do not hold (Megatron-core's expert data parallel)
};
std::string_view to_string(ReplicaGroup group);

/// Whether a new Parameter allocates its value and grad. Deferred: neither, and initialize()
/// leaves it alone; ZeRO-3 then materialises only each rank's slice (initialize_range), so no
/// rank ever holds the whole model (PyTorch's meta-device initialisation for FSDP plays the
/// same role), and a parameter table (names, shapes, shards) costs no values. An explicit
/// build option of the layers, CausalLm and PipelineStage.
enum class ParameterStorage : std::uint8_t { allocated, deferred };

/// A parameter's placement on the device mesh, one entry per axis (as PyTorch DTensor's
/// placements, Megatron-core's expert/allreduce parameter flags):
///   tp      sharded along shard.dim (the even split) when is_sharded(), else replicated;
///   ep      an expert's weights (replicas = expert) live on the one ep rank that holds the
///           expert; every other parameter is replicated over ep;
///   pp      held by the stage that builds it (tied_copy: gpt2's second copy on the last stage);
///   dp, cp  replicated over its replica group, which reduces its gradient.
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
  ShardSlice shard;           // this rank's slice of the logical tensor
  // A second copy of a tied parameter on another pipeline stage (gpt2's LM head on the last
  // stage, tied to the token embedding on the first): same name and values; its gradient is
  // summed with the original's each step, and it is left out of the grad norm and checkpoints.
  bool tied_copy = false;
  ReplicaGroup replicas = ReplicaGroup::dense;  // see Placement above

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
  Parameter* param = nullptr;  // name, weight decay, tp sharding, tied_copy
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
