// src/meshtrain/parallel/tp/parallel_linear.h
//
// The two tensor-parallel linears of Megatron-LM (Shoeybi et al. 2019, §3, Fig. 3): Y = X·Wᵀ
// with W [out, in] split over the tp group by rows (column-parallel: each rank computes
// out/tp output features) or by columns (row-parallel: each rank consumes in/tp input
// features and the partial outputs are summed). Communication comes from the adjoint pairs
// of tp_regions.h: column-parallel enters through EnterTpRegion (identity / all-reduce, or
// all-gather / reduce-scatter along tokens under sequence parallelism, Korthikanti et al.
// 2022, §4.2.2), row-parallel leaves through ExitTpRegion. Each weight and bias is allocated
// from its record of the placement table (mesh/placement.h): the record's tp slice of the
// logical [out, in] tensor, initialised from the same (seed, name, index) as the unsharded
// weight. With a tp group of one rank they compute exactly what a plain nn.Linear computes.
//
// What backward needs is kept per activation slot (activation_slots.h), the context's
// (micro_batch_context.h). When the context names a weight-gradient queue (weight_grad_queue.h)
// backward computes the input and bias gradients only and queues the weight gradients there
// under the context's slot.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/layers/activation_slots.h"
#include "meshtrain/layers/parameter.h"
#include "meshtrain/parallel/tp/tp_regions.h"

namespace meshtrain {

/// One weight of a column-parallel block: `<prefix>.weight` [out_features, in] and, when the
/// table lists it, `<prefix>.bias` [out_features], their records sharded over tp along dim 0 in
/// `parts` blocks (GPT-2's fused c_attn [q; k; v] has 3, so that a rank holds the same heads
/// of q, k and v); (out_features / parts) % tp == 0 (validated config).
struct ColumnWeight {
  std::string prefix;
  float init_std = 0.02f;
};

/// Several column-parallel weights reading the same input (Llama's q/k/v projections, SwiGLU's
/// gate and up): the input enters the tensor-parallel region once — one all-gather under
/// sequence parallelism, not one per weight — and their input gradients are summed before it
/// leaves.
class ColumnParallelLinear {
 public:
  /// Allocates every weight (and bias) from its record in `records`, this rank's tp slice;
  /// MT_CHECKs that they read the same number of input features.
  ColumnParallelLinear(std::vector<ColumnWeight> weights, const PlacementTable& records,
                       const TensorParallel& tp,
                       ParameterStorage storage = ParameterStorage::allocated);

  /// x [tokens, in] replicated over tp, or [tokens/tp, in] under sequence parallelism → one
  /// output per weight, [tokens, out_i/tp] (this rank's features of each part, part by part).
  /// Keeps the entered (full) input [tokens, in] for backward, in slot ctx.slot (rounded to
  /// the weights' dtype when they are 16-bit: layers/autocast.h).
  std::vector<Tensor> forward(const Tensor& x, const MicroBatchContext& ctx);
  /// With `add_bias` false the outputs are x·Wᵀ alone and the caller adds the biases
  /// (bias(i)) in its own element-wise pass (GeluMlp's bias + GELU), and backward(dys, false)
  /// leaves the bias gradients to it as well.
  std::vector<Tensor> forward(const Tensor& x, bool add_bias, const MicroBatchContext& ctx);
  /// Shard i's bias (nullptr without biases).
  Parameter* bias(std::size_t i) { return shards_.at(i).bias ? &*shards_.at(i).bias : nullptr; }
  /// Drops slot ctx.slot's kept input (activation recompute).
  void discard(const MicroBatchContext& ctx) { saved_.release(ctx.slot); }
  /// dys (one per weight, as forward's outputs) → dx in forward's input layout; frees the
  /// slot's state. Accumulates every shard's weight and bias gradients (the weights' deferred
  /// to ctx's queue when it names one: the queue then keeps the full input and the dys until
  /// W).
  Tensor backward(std::span<const Tensor> dys, const MicroBatchContext& ctx);
  /// `bias_grads` false: the bias gradients are the caller's (see forward(x, false, ctx)).
  Tensor backward(std::span<const Tensor> dys, bool bias_grads, const MicroBatchContext& ctx);
  ParameterList parameters();

 private:
  struct Shard {
    std::int64_t out_local;
    Parameter weight;
    std::optional<Parameter> bias;
  };
  std::int64_t in_;
  TensorParallel tp_;
  std::vector<Shard> shards_;
  struct State {
    Tensor x_full;  // matmul_input of the entered input: f32, or the weights' 16-bit dtype
  };
  Saved<State> saved_;
};

class RowParallelLinear {
 public:
  /// `<prefix>.weight` shard [out, in/tp] = columns [r·in/tp, (r+1)·in/tp) of the logical
  /// weight (its record sharded over tp along dim 1); `<prefix>.bias` [out], when `records`
  /// lists it, replicated over tp (added once, after the reduction).
  RowParallelLinear(const std::string& prefix, const PlacementTable& records, float init_std,
                    const TensorParallel& tp,
                    ParameterStorage storage = ParameterStorage::allocated);

  /// x [tokens, in/tp] (this rank's input features) → [tokens, out] replicated over tp, or
  /// [tokens/tp, out] (this rank's rows) under sequence parallelism. Keeps x for backward, in
  /// slot ctx.slot (rounded to the weight's dtype when it is 16-bit).
  Tensor forward(const Tensor& x, const MicroBatchContext& ctx);
  /// Drops slot ctx.slot's kept input (activation recompute).
  void discard(const MicroBatchContext& ctx) { saved_.release(ctx.slot); }
  /// Keeps x [tokens, in/tp] as slot ctx.slot's input, as forward(x, ctx) does, without
  /// computing anything: selective recompute drops the attention output this layer reads
  /// (discard(ctx) after forward) and hands it back, recomputed, before backward.
  void keep_input(const Tensor& x, const MicroBatchContext& ctx);
  /// dy in forward's output layout → dx [tokens, in/tp]; frees the slot's state. The bias
  /// gradient comes from dY as held here: identical on every rank without sequence
  /// parallelism, a partial sum over this rank's tokens with it (summed over tp once per step
  /// by the trainer). The weight gradient is deferred to ctx's queue when it names one (the
  /// queue then keeps x and the full dY until W).
  Tensor backward(const Tensor& dy, const MicroBatchContext& ctx);
  ParameterList parameters();

 private:
  std::int64_t in_local_, out_;
  TensorParallel tp_;
  Parameter weight_;
  std::optional<Parameter> bias_;
  struct State {
    Tensor x;  // matmul_input(x, weight_)
  };
  Saved<State> saved_;
};

}  // namespace meshtrain
