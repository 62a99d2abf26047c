// src/meshtrain/layers/autocast.h
//
// How a layer reads its parameters under mixed precision (docs/mixed_precision.md). The trainer
// may replace any Parameter::value by a bf16 or f16 tensor (same shape; the f32 master copy
// lives with the optimizer); Parameter::grad stays f32. Layers decide by value.dtype() alone,
// with no precision setting of their own, following PyTorch autocast's rule:
//   - a matrix product with a 16-bit weight rounds its input X to the weight's dtype, runs the
//     16-bit GEMM with f32 accumulation and an f32 output, and keeps the 16-bit X for backward
//     (half the bytes of the f32 X: the activation memory mixed precision saves);
//   - every other reader of a parameter (norm weights and biases, linear biases, embedding
//     tables) widens it to f32, and the norms, softmax, activations and the cross-entropy
//     run in f32 as before;
//   - the attention core's tile products take bf16 operands when the q/k/v weight is bf16
//     (attention_operands), with f32 sums, softmax statistics and outputs.
// With f32 values everything below is the f32 code path of before, bit for bit.
#pragma once

#include <cstdint>

#include "meshtrain/core/tensor.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// The tile GEMM operand precision of the attention core (kernels::AttentionChunkDims::
/// operands) for a layer whose q/k/v projection weight is `qkv_weight`: bf16 when its value is
/// bf16 (FlashAttention-2's mixed precision: bf16 operands, f32 sums and softmax); f32 for f32
/// and for f16 (the chunk kernels have no f16 operands; an f16 model runs the core in f32, as
/// before).
DType attention_operands(const Parameter& qkv_weight);

/// p.value as f32: the tensor itself (shared storage) when it is f32, else a widened copy
/// (MemCategory::activations), exact, freed when the caller drops it. For small parameters
/// read whole (norms, biases).
Tensor value_f32(const Parameter& p);

/// x [tokens, in] f32 as the product with `weight` reads it: x itself (shared) when
/// weight.value is f32, else x rounded to weight.value's dtype (a new MemCategory::activations
/// tensor). What a matmul layer keeps for backward.
Tensor matmul_input(const Tensor& x, const Parameter& weight);

/// y [tokens, out] f32 (overwritten) = x·Wᵀ (+ bias), W = weight.value [out, in]; x from
/// matmul_input (of the weight's dtype, MT_CHECKed). bias [out] (nullptr: none) is added in
/// f32.
void autocast_linear_forward(const Tensor& x, const Parameter& weight, const Parameter* bias,
                             Tensor& y);

/// out [rows, C] f32 (overwritten) = rows `ids` of a table shard [table_rows, C] holding ids
/// [first, first + table_rows), zero rows for other ids (kernels::embedding_shard_forward);
/// the table may be f32, bf16 or f16 (only the looked-up rows are widened).
void embedding_lookup(const std::int32_t* ids, const Tensor& table, std::int64_t first,
                      std::int64_t table_rows, float* out, std::int64_t rows);

}  // namespace meshtrain
