// src/meshtrain/mesh/placement.h
//
// The placement table: one record per parameter of a model on a mesh, saying for every mesh
// axis whether the tensor is replicated, sharded (which dimension, which part) or held by one
// coordinate only, which ranks sum its gradient, which slice ZeRO gives each rank, and which
// copy counts in the grad norm and the checkpoint. One pure function of (model config, layout)
// builds it, with no groups, no tensors and no MPI; the model build hands every layer the
// records of its parameters, which it allocates from (their tp slices, an ep rank's experts),
// and gradient reduction, ZeRO, the grad norm, checkpoints, the offline reshard, export and
// the planner read it. The models: PyTorch DTensor's per-axis placements
// (torchtitan's parallelize plans) and Megatron-core's per-parameter `allreduce`,
// `sequence_parallel` and `is_expert` attributes, as one table.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/tensor.h"
#include "meshtrain/mesh/mesh_shape.h"
#include "meshtrain/mesh/shard_slice.h"

namespace meshtrain {

/// The ranks that hold the same elements of a parameter and see different tokens: its gradient
/// is summed over them, its optimizer state ZeRO-sliced over them, and one of them counts its
/// elements in the grad norm and saves them.
enum class ReplicaGroup : std::uint8_t {
  dense,   // dp × cp: every weight outside the experts
  expert,  // expert data parallel, (dp/ep) × cp ranks: an expert's weights, which the other ep
           // ranks of its dp × cp group do not hold (Megatron-core's expert data parallel)
};
std::string_view to_string(ReplicaGroup group);

/// How a tensor lies along one mesh axis.
enum class PlacementKind : std::uint8_t {
  replicate,  // every coordinate of the axis holds the whole of it
  shard,      // Megatron-LM's even split of dimension `dim` (mesh/shard_slice.h: even_shard)
  owned,      // only coordinate `owner` holds it (a pipeline stage's layers, an ep rank's experts)
};

struct AxisPlacement {
  PlacementKind kind = PlacementKind::replicate;
  int dim = 0;             // shard: the logical dimension split over the axis
  std::int64_t parts = 1;  // shard: blocks of `dim` each split alike (GPT-2's fused [q; k; v]: 3)
  int owner = 0;           // owned: the coordinate that holds the tensor
  bool operator==(const AxisPlacement&) const = default;
};

/// This rank's positions in the groups a placement refers to.
struct PlacementRanks {
  int tp = 0;      // rank in the tp group
  int dense = 0;   // rank in the dp × cp group
  int expert = 0;  // rank in the expert-data-parallel group
  int replica(ReplicaGroup g) const { return g == ReplicaGroup::expert ? expert : dense; }
};

/// The ranks of world rank `rank` in a mesh of `shape`, by arithmetic: dense = its rank in the
/// dp × cp group, d·cp + c; expert = its rank in the expert-data-parallel group,
/// (d div ep)·cp + c (MeshShape::expert_dp_groups).
PlacementRanks placement_ranks(const MeshShape& shape, int rank);

/// Ranks in replica group g of a mesh of `shape`: dp·cp, or (dp·cp)/ep for experts.
int replica_count(const MeshShape& shape, ReplicaGroup g);

/// Elements per replica in ZeRO's communication buffers for a tensor of `numel` elements (its
/// tp shard, flattened): numel at stage 0; otherwise ⌈numel / ranks⌉, rounded up to even under
/// 16-bit compute (`low_precision`) so each rank's slice is whole 4-byte words (Rajbhandari et
/// al. 2020, §5: each data-parallel rank owns 1/N_d of the states).
std::int64_t zero_slice(int stage, std::int64_t numel, int ranks, bool low_precision);
/// The elements [begin, end) of that flattened tensor replica `rank` owns (its optimizer
/// shard): all of them at stage 0, else [min(r·s, numel), min((r+1)·s, numel)) with s =
/// zero_slice (the last ranks' may be empty).
std::pair<std::int64_t, std::int64_t> zero_owned_range(int stage, std::int64_t numel, int rank,
                                                       int ranks, bool low_precision);

/// One parameter's placement on the mesh.
struct ParamPlacement {
  /// `name` of `shape`, replicated over every axis (a tensor built outside a model's table:
  /// a layer on its own, a test).
  static ParamPlacement whole(std::string name, Shape shape);
  /// `name` of `shape` sharded over tp along `dim` in `parts` blocks (ColumnParallelLinear's
  /// weight: dim 0; RowParallelLinear's: dim 1), every other axis replicated.
  static ParamPlacement tp_shard(std::string name, Shape shape, int dim, std::int64_t parts = 1);

  std::string name;  // Hugging Face name (a tied copy shares its original's)
  Shape shape;       // the logical tensor, f32
  std::array<AxisPlacement, 5> axes{};  // by Axis: pp, dp, cp, tp, ep
  int chunk = 0;                        // the global model chunk that builds it
  bool tied_copy = false;  // gpt2's LM head on the last chunk: a copy of the token embedding
  bool tied = false;       // this tensor has a tied twin (gpt2 split into several chunks)
  ReplicaGroup replicas = ReplicaGroup::dense;
  // Sequence parallelism: a tensor replicated over tp sees only this rank's tokens, so its
  // gradient is a partial sum over tp (Korthikanti et al. 2022, §4.2.2).
  bool sum_over_tp = false;
  int zero_stage = 0;          // parallel.zero_stage: ≥ 1 slices the optimizer over `replicas`
  bool low_precision = false;  // bf16/fp16 compute (ZeRO's slices are whole 4-byte words)

  const AxisPlacement& on(Axis axis) const { return axes[static_cast<std::size_t>(axis)]; }
  bool sharded_over_tp() const { return on(Axis::tp).kind == PlacementKind::shard; }
  /// Whether the rank at `c` holds (a slice of) this tensor.
  bool held_by(const MeshShape& mesh, const MeshCoords& c) const;
  /// The slice of tp rank `rank` of `ranks` (mesh/shard_slice.h); the whole tensor when not
  /// sharded over tp.
  ShardSlice tp_slice(int rank, int ranks) const;
  /// The slice of the rank at `c`: tp_slice(c.tp, mesh.tp).
  ShardSlice slice(const MeshShape& mesh, const MeshCoords& c) const { return tp_slice(c.tp, mesh.tp); }
  /// The rank's tensor shape (the slice's, padding included).
  Shape local_shape(const MeshShape& mesh, const MeshCoords& c) const;
  /// The rank's ZeRO range of its flattened local tensor (zero_owned_range).
  std::pair<std::int64_t, std::int64_t> zero_range(const MeshShape& mesh, const MeshCoords& c) const;
  /// Whether the copy of a rank with `ranks` is the one that counts, in the grad norm, the
  /// found-inf check, a checkpoint and an export: never a tied copy; on tp rank 0 unless
  /// sharded over tp (then each tp rank holds its own elements); on replica 0 unless ZeRO
  /// slices the optimizer state (then each replica's slice is its own). pp and ep need no
  /// term: a stage or an ep rank holds its tensors alone.
  bool counts_copy(const PlacementRanks& ranks) const;
  /// The mesh axes its gradient is summed over, in mesh order ("dp", "cp", "tp" under sequence
  /// parallelism, "pp" for tied twins on different stages; experts: dp within the ep block).
  std::vector<Axis> grad_sum_axes(const MeshShape& mesh) const;
};

/// What of a run's settings placement depends on, beside the model.
struct PlacementLayout {
  MeshShape mesh;
  bool sequence_parallel = false;
  int zero_stage = 0;
  bool low_precision = false;
  std::vector<std::int64_t> layers_per_chunk;  // pp · virtual_stages counts, global chunk order
};
/// The layout of a validated config (config/pipeline_rules.h's split).
PlacementLayout placement_layout(const Config& config);

class PlacementTable {
 public:
  PlacementTable(MeshShape mesh, std::vector<ParamPlacement> params);

  const MeshShape& mesh() const noexcept { return mesh_; }
  /// Every record, chunk by chunk in global chunk order, each chunk in its build order.
  const std::vector<ParamPlacement>& params() const noexcept { return params_; }
  /// The record of `name` (its tied copy when `tied_copy`); MT_CHECKs that it exists.
  const ParamPlacement& at(std::string_view name, bool tied_copy = false) const;
  /// The record of `name` (not a tied copy), or nullptr: a layer's optional tensors (biases).
  const ParamPlacement* find(std::string_view name) const;
  /// The records the rank at `c` holds, in the order its pipeline stage builds them (its
  /// chunks k·pp + c.pp for k = 0, 1, …).
  std::vector<const ParamPlacement*> held_by(const MeshCoords& c) const;

 private:
  const ParamPlacement* lookup(std::string_view name, bool tied_copy) const;

  MeshShape mesh_;
  std::vector<ParamPlacement> params_;
  // (name, tied_copy) → index in params_: every layer looks its records up by name, and a
  // linear scan made building a model quadratic in its tensor count.
  std::map<std::pair<std::string, bool>, std::size_t> index_;
};

/// The table of `model` (vocab_size known) on `layout`: a pure function (no groups, no
/// tensors), in the order model/causal_lm.cpp builds the parameters. The layers allocate
/// every parameter from its record; PipelineStage MT_CHECKs they built each record once, in
/// order.
PlacementTable placement_table(const ModelConfig& model, const PlacementLayout& layout);
/// placement_table(config.model, placement_layout(config)).
PlacementTable placement_table(const Config& config);

/// "replicate", "shard(0)", "shard(0, 3 parts)", "owned(2)".
std::string to_string(const AxisPlacement& a);

}  // namespace meshtrain
