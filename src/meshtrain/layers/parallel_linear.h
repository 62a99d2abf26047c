// src/meshtrain/layers/parallel_linear.h
//
// The two tensor-parallel linears of Megatron-LM (Shoeybi et al. 2019, §3, Fig. 3): Y = X·Wᵀ
// with W [out, in] split over the tp group by rows (column-parallel: each rank computes
// out/tp output features) or by columns (row-parallel: each rank consumes in/tp input
// features and the partial outputs are summed). Communication comes from the adjoint pairs
// of tp_regions.h: column-parallel enters through CopyToTpRegion (or, with sequence
// parallelism, GatherFromSequenceRegion), row-parallel leaves through ReduceFromTpRegion (or
// ScatterToSequenceRegion; Korthikanti et al. 2022, §4.2.2). Shards are slices of the logical
// [out, in] tensor (ShardSlice), initialised from the same (seed, name, index) as the
// unsharded Linear. With a tp group of one rank they compute exactly what Linear computes.
#pragma once

#include <optional>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

struct ParallelLinearShape {
  std::int64_t in_features;   // logical
  std::int64_t out_features;  // logical
  bool bias;
  float init_std;
  bool sequence_parallel = false;
};

class ColumnParallelLinear {
 public:
  /// `<prefix>.weight` shard [out/tp, in] = rows [r·out/tp, (r+1)·out/tp) of the logical weight,
  /// `<prefix>.bias` shard [out/tp]; r = tp rank. out % tp == 0 (validated with the config).
  ColumnParallelLinear(const std::string& prefix, const ParallelLinearShape& shape,
                       ProcessGroup& tp);

  /// x [tokens, in] replicated over tp, or [tokens/tp, in] (this rank's rows) under sequence
  /// parallelism → [tokens, out/tp], this rank's output columns. Keeps the full input.
  Tensor forward(const Tensor& x);
  /// dy [tokens, out/tp] → dx in the layout of forward's x: all-reduced over tp (summing each
  /// rank's partial dX), or reduce-scattered along tokens under sequence parallelism.
  /// Accumulates the shard's weight and bias gradients.
  Tensor backward(const Tensor& dy);
  ParameterList parameters();

 private:
  ParallelLinearShape shape_;
  ProcessGroup& tp_;
  std::int64_t out_local_;
  Parameter weight_;
  std::optional<Parameter> bias_;
  Tensor x_full_;
};

class RowParallelLinear {
 public:
  /// `<prefix>.weight` shard [out, in/tp] = columns [r·in/tp, (r+1)·in/tp) of the logical
  /// weight; `<prefix>.bias` [out] replicated over tp (added once, after the reduction).
  RowParallelLinear(const std::string& prefix, const ParallelLinearShape& shape, ProcessGroup& tp);

  /// x [tokens, in/tp] (this rank's input features) → [tokens, out] replicated over tp, or
  /// [tokens/tp, out] (this rank's rows) under sequence parallelism.
  Tensor forward(const Tensor& x);
  /// dy in forward's output layout → dx [tokens, in/tp]. The bias gradient is computed from the
  /// full dY on every rank, so the replicated bias gets the same gradient everywhere.
  Tensor backward(const Tensor& dy);
  ParameterList parameters();

 private:
  ParallelLinearShape shape_;
  ProcessGroup& tp_;
  std::int64_t in_local_;
  Parameter weight_;
  std::optional<Parameter> bias_;
  Tensor x_;
};

}  // namespace meshtrain
