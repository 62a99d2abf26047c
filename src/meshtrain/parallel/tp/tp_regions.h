// src/meshtrain/parallel/tp/tp_regions.h
//
// The communication of tensor and sequence parallelism as forward/backward adjoint pairs
// (Megatron-LM's f and g operators, Shoeybi et al. 2019, §3 and Fig. 3; the sequence-parallel
// pair of Korthikanti et al. 2022, §4.2.2 and Fig. 5). Each struct names one region boundary;
// its backward is the adjoint (transpose) of its forward, so a layer's backward is visibly the
// mirror of its forward. Every operation returns at once when the group has one rank (through
// ProcessGroup), so with tp = 1 a parallel layer is the plain layer.
//
// Shapes are [tokens, features] row-major; "sequence-sharded" means rank r holds rows
// [r·tokens/tp, (r+1)·tokens/tp), which is why the all-gather and reduce-scatter along dim 0
// need no reordering.
#pragma once

#include "meshtrain/comm/process_group.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {

/// Entering a tensor-parallel region (before a column-parallel linear): forward identity
/// (x is replicated over tp), backward all-reduce of dX (each rank holds a partial sum).
struct CopyToTpRegion {
  static Tensor forward(const Tensor& x, ProcessGroup& tp);
  static Tensor backward(const Tensor& dx, ProcessGroup& tp);  // in place, returns dx
};

/// Leaving a tensor-parallel region (after a row-parallel linear): forward all-reduce of the
/// partial outputs, backward identity.
struct ReduceFromTpRegion {
  static Tensor forward(const Tensor& y, ProcessGroup& tp);  // in place, returns y
  static Tensor backward(const Tensor& dy, ProcessGroup& tp);
};

/// Sequence parallel, entering: forward all-gather along tokens, [tokens/tp, h] → [tokens, h];
/// backward reduce-scatter along tokens, [tokens, h] → [tokens/tp, h].
struct GatherFromSequenceRegion {
  static Tensor forward(const Tensor& x, ProcessGroup& tp);
  static Tensor backward(const Tensor& dx, ProcessGroup& tp);
};

/// Sequence parallel, leaving: forward reduce-scatter along tokens of the partial outputs,
/// [tokens, h] → [tokens/tp, h]; backward all-gather along tokens.
struct ScatterToSequenceRegion {
  static Tensor forward(const Tensor& y, ProcessGroup& tp);
  static Tensor backward(const Tensor& dy, ProcessGroup& tp);
};

/// The tensor-parallel group a layer is split over, and whether the regions between its
/// tensor-parallel blocks are sequence-parallel (activations [tokens/tp, h] there).
struct TensorParallel {
  ProcessGroup& group;
  bool sequence_parallel = false;
};

/// Entering a tensor-parallel block (before column-parallel weights): CopyToTpRegion, or
/// GatherFromSequenceRegion under sequence parallelism. Output [tokens, h] on every rank.
struct EnterTpRegion {
  static Tensor forward(const Tensor& x, const TensorParallel& tp);
  static Tensor backward(const Tensor& dx, const TensorParallel& tp);
};

/// Leaving a tensor-parallel block (partial sums of a row-parallel product or a vocabulary
/// shard's lookup): ReduceFromTpRegion, or ScatterToSequenceRegion under sequence parallelism.
/// Output [tokens, h], or [tokens/tp, h] under sequence parallelism.
struct ExitTpRegion {
  static Tensor forward(const Tensor& y, const TensorParallel& tp);
  static Tensor backward(const Tensor& dy, const TensorParallel& tp);
};

}  // namespace meshtrain
