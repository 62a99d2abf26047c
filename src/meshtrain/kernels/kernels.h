// src/meshtrain/kernels/kernels.h
//
// The math of one rank, forward and backward, on raw f32 arrays (and, for the matmuls and the
// embedding lookup of mixed precision, 16-bit bf16/f16 operands as their bit patterns,
// core/half.h; outputs and accumulations stay f32). Shapes use the conventions of
// shared/DESIGN.md: activations [tokens, features] row-major, weights [out, in] as nn.Linear.
// "overwritten" outputs need no initial value; "ACCUMULATED (+=)" outputs add to what is there,
// so gradient accumulation over micro-batches and over the two uses of a tied weight needs no
// temporary buffer (the optimizer step zeroes gradients once per global batch).
// Kernels allocate nothing on the tracked allocator, communicate nothing, and know no groups.
// Implementations live in kernels/cpu/ (oneDNN GEMM, OpenMP loops); kernels/cuda/ can provide
// the same functions later.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "meshtrain/core/dtype.h"

namespace meshtrain::kernels {

/// Compute threads for OpenMP loops and oneDNN in this process (≥ 1).
void set_num_threads(int threads);
int num_threads();

// ---------------------------------------------------------------------------------------------
// GEMM (oneDNN matmul)

/// C = alpha · op(A) · op(B) + beta · C, row-major.
///   op(A) [M, K]: A is stored [M, K], or [K, M] when trans_a
///   op(B) [K, N]: B is stored [K, N], or [N, K] when trans_b
///   C     [M, N]
/// beta must be 0 (C overwritten) or 1 (C accumulated).
void gemm(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
          bool trans_a, bool trans_b, float alpha, float beta);

/// gemm with A and B of `dtype` (bf16 or f16, MT_CHECKed) and C f32, shapes and beta as gemm:
/// the 16-bit products are accumulated in f32 (Micikevicius et al. 2018, §3.3). bf16 runs
/// oneDNN's bf16 matmul (about twice the f32 rate here). f16 has no oneDNN CPU matmul in the
/// Debian build (2.6): its operands are widened to f32, exactly, and the f32 GEMM runs — the
/// same result as f16 inputs with f32 accumulation, at the f32 rate.
void gemm_16bit(const std::uint16_t* a, const std::uint16_t* b, float* c, std::int64_t m,
                std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, float alpha, float beta,
                DType dtype);

// ---------------------------------------------------------------------------------------------
// Linear: y = x · Wᵀ + b (PyTorch nn.Linear)

struct LinearDims {
  std::int64_t tokens;
  std::int64_t in_features;
  std::int64_t out_features;
};

///   x [tokens, in]   w [out, in]   b [out] or nullptr   →   y [tokens, out] overwritten
void linear_forward(const float* x, const float* w, const float* b, float* y,
                    const LinearDims& dims);

///   x [tokens, in]   w [out, in]   dy [tokens, out]        read
///   dx [tokens, in] overwritten (nullptr: not computed)
///   dw [out, in] ACCUMULATED    db [out] ACCUMULATED (nullptr: no bias)
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, const LinearDims& dims);

/// Mixed precision: x, w of `dtype` (bf16 or f16), y f32 = x·Wᵀ (+ b, f32) with f32
/// accumulation (gemm_16bit).
///   x [tokens, in]   w [out, in]   b [out] f32 or nullptr   →   y [tokens, out] overwritten
void linear_forward_16bit(const std::uint16_t* x, const std::uint16_t* w, const float* b, float* y,
                          const LinearDims& dims, DType dtype);
/// Mixed precision, the two GEMMs of linear_backward: x, w, dy of `dtype` (dy rounded from the
/// f32 gradient by the caller); dx f32 overwritten (nullptr: not computed; w is then not read),
/// dw f32 ACCUMULATED (nullptr: not computed). The bias gradient comes from the f32 dy:
/// bias_backward.
///   x [tokens, in]   w [out, in]   dy [tokens, out]   dx [tokens, in]   dw [out, in]
void linear_backward_16bit(const std::uint16_t* x, const std::uint16_t* w, const std::uint16_t* dy,
                           float* dx, float* dw, const LinearDims& dims, DType dtype);
///   dy [tokens, out] f32   →   db [out] ACCUMULATED += Σ_t dy[t, :] (linear_backward's bias
///   term, the same summation order)
void bias_backward(const float* dy, float* db, std::int64_t tokens, std::int64_t out);

// ---------------------------------------------------------------------------------------------
// LayerNorm over the last dim (Ba et al. 2016; PyTorch nn.LayerNorm, biased variance)

///   x [rows, C]  weight [C]  bias [C] or nullptr  →  y [rows, C], mean [rows], rstd [rows]
///   (all overwritten; mean and rstd are kept for backward)
void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                       float* mean, float* rstd, std::int64_t rows, std::int64_t C, float eps);

///   dx [rows, C] overwritten; dweight [C], dbias [C] (or nullptr) ACCUMULATED
void layernorm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                        const float* dy, float* dx, float* dweight, float* dbias, std::int64_t rows,
                        std::int64_t C);

/// Residual add fused into the norm (pre-norm block, h = a + b; y = LayerNorm(h)): one pass over
/// the rows instead of add_inplace then layernorm_forward, bitwise equal to them.
///   a, b [rows, C]  →  h [rows, C] (the new residual stream), y, mean, rstd as layernorm_forward
void residual_layernorm_forward(const float* a, const float* b, float* h, const float* weight,
                                const float* bias, float* y, float* mean, float* rstd,
                                std::int64_t rows, std::int64_t C, float eps);

/// layernorm_backward whose dx also receives the residual branch's gradient: dx = ∂LN + dresidual
/// (dresidual [rows, C] or nullptr), bitwise equal to layernorm_backward then add_inplace. Each
/// row's result depends on that row alone (not on rows, threads or how tokens are split).
void layernorm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                        const float* dy, const float* dresidual, float* dx, float* dweight,
                        float* dbias, std::int64_t rows, std::int64_t C);

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation as GPT-2 (Hendrycks & Gimpel 2016, eq. after §2;
// PyTorch GELU(approximate="tanh")): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))

void gelu_forward(const float* x, float* y, std::int64_t n);                     // y overwritten
void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n);  // dx overwritten

/// The fc layer's bias add fused with the GELU: pre [rows, F] += bias [F] (or nullptr) in
/// place, y [rows, F] = gelu(pre), in one pass; bitwise linear_forward's add then gelu_forward.
void bias_gelu_forward(float* pre, const float* bias, float* y, std::int64_t rows, std::int64_t F);
/// dx [rows, F] = dy ∘ gelu'(pre) and dbias [F] += Σ_rows dx (or nullptr) in one pass; bitwise
/// gelu_backward then bias_backward (each dbias entry sums its rows in order 0, 1, …, whatever
/// the thread count; dx may alias dy).
void gelu_bias_backward(const float* pre, const float* dy, float* dx, float* dbias,
                        std::int64_t rows, std::int64_t F);

// ---------------------------------------------------------------------------------------------
// Causal grouped-query self-attention, one call for all heads (Vaswani et al. 2017, eq. 1,
// with a causal mask; grouped-query heads as Ainslie et al. 2023): `heads` query heads share
// `kv_heads` key/value heads, query head h reading kv head h / (heads / kv_heads); kv_heads ==
// heads is multi-head attention. q, k, v are held in row-strided arrays, head h at columns
// [h·head_dim, (h+1)·head_dim) of a row. GPT-2's fused c_attn output [q | k | v], each
// C = heads·head_dim wide, is the case q = qkv, k = qkv + C, v = qkv + 2C, all strides 3C.
// Scale 1/√head_dim. Forward keeps only the log-sum-exp of each score row (FlashAttention-2,
// Dao 2023, §3.1); backward recomputes the probabilities from q, k and lse, so memory is O(T)
// per head, and the lse form is what ring attention merges across context-parallel ranks later.

struct GqaDims {
  std::int64_t batch;     // sequences
  std::int64_t seq_len;   // T
  std::int64_t heads;     // query heads on this rank
  std::int64_t kv_heads;  // key/value heads on this rank; heads % kv_heads == 0
  std::int64_t head_dim;
};

/// Row t of sequence b of head h starts at q + (b·T + t)·q_stride + h·head_dim (k, v alike with
/// kv_stride). Strides are in floats, ≥ heads·head_dim (q) and ≥ kv_heads·head_dim (k, v).
struct QkvRows {
  const float* q;
  const float* k;
  const float* v;
  std::int64_t q_stride;
  std::int64_t kv_stride;
};
struct QkvGradRows {
  float* dq;
  float* dk;
  float* dv;
  std::int64_t q_stride;
  std::int64_t kv_stride;
};

///   out [batch·T, heads·head_dim], lse [batch, heads, T]   (overwritten)
void gqa_attention_forward(const QkvRows& in, float* out, float* lse, const GqaDims& dims);
///   in, out, lse as from forward; dout [batch·T, heads·head_dim]
///   dq, dk, dv overwritten (only the head columns of each row; other columns untouched)
void gqa_attention_backward(const QkvRows& in, const float* out, const float* lse,
                            const float* dout, const QkvGradRows& grad, const GqaDims& dims);

// ---------------------------------------------------------------------------------------------
// Attention on one (query chunk, key/value chunk) pair: the tiled FlashAttention-2 algorithm
// (Dao 2023, Algorithm 1 forward, Algorithm 2 backward): blocks of queries × blocks of keys,
// online softmax, no T×T matrix; forward returns the output and the log-sum-exp of every score
// row, backward recomputes the probabilities from lse and uses D = rowsum(dO∘O). One process
// calls it once per layer (mask causal, offsets 0); ring attention (context parallel) calls it
// once per (local query chunk, visiting key/value chunk) and merges the partial results by
// log-sum-exp (attention_merge). Grouped-query heads as gqa_attention_forward.
// CPU: kernels/cpu/flash_attention*.cpp — blocks of 96 queries × 48 keys, f32 with the same
// exp as gqa_attention_* (< 1 ulp); every result is bitwise the same for every thread count
// (each output element is owned by one task and summed in a fixed order; no atomics). With
// dims.operands = bf16 the tile GEMMs take bf16 operands (AVX512_BF16 VDPBF16PS where the
// build has it, else bf16-rounded operands through the f32 micro-kernel; flash_operands.h);
// results then differ from f32 by a few bf16 roundings (relative ~2⁻⁸), still deterministic.

enum class AttentionMask : std::uint8_t {
  causal,  // key j is visible to query i iff kv_offset + j ≤ q_offset + i (global positions)
  full,    // every key is visible (a key chunk wholly before the query chunk)
  skip,    // no key is visible: forward writes out = 0 and lse = −inf, backward adds nothing
};

/// The rows of one chunk pair. Row i (0 ≤ i < q_len) of sequence b of the query chunk is row
/// b·q_seq_rows + i of q, out, dout and dq (their pointers already at the chunk's first row);
/// row j of the key/value chunk is row b·kv_seq_rows + j of k, v, dk, dv. lse and delta of
/// (b, h, i) sit at (b·heads + h)·lse_seq_len + i (lse pointer already at the chunk's first
/// row). Offsets are the global sequence positions of the chunks' first rows (the causal mask
/// and nothing else reads them).
struct AttentionChunkDims {
  std::int64_t batch;     // sequences
  std::int64_t q_len;     // query rows per sequence in the chunk (any ≥ 0; need not fill a block)
  std::int64_t kv_len;    // key/value rows per sequence in the chunk
  std::int64_t heads;     // query heads on this rank
  std::int64_t kv_heads;  // heads % kv_heads == 0
  std::int64_t head_dim;
  std::int64_t q_offset = 0;
  std::int64_t kv_offset = 0;
  std::int64_t q_seq_rows;   // ≥ q_len
  std::int64_t kv_seq_rows;  // ≥ kv_len
  std::int64_t lse_seq_len;  // ≥ q_len
  /// Precision of the tile GEMM operands: f32, or bf16 (Q, K, V, dO and the tiles P, dS
  /// rounded to bf16, ties to even; products summed in f32; softmax statistics, lse, D,
  /// outputs and gradients f32), FlashAttention-2's mixed precision. Other dtypes MT_CHECK.
  /// A field rather than a parameter: every ring / Ulysses call already carries the dims.
  DType operands = DType::f32;
};

///   in: q [.., heads·head_dim] (stride in.q_stride), k, v [.., kv_heads·head_dim] (in.kv_stride)
///   out [.., heads·head_dim] (row stride out_stride floats), lse f32: overwritten for the
///   chunk's rows; a row that sees no key gets out = 0, lse = −inf. Scale 1/√head_dim.
///   MT_CHECKs dims and strides. Memory: O(block) scratch per thread, nothing O(T²).
void attention_chunk_forward(const QkvRows& in, const AttentionChunkDims& dims, AttentionMask mask,
                             float* out, std::int64_t out_stride, float* lse);

/// Exact merge of two partial attentions over disjoint key sets (Milakov & Gimelshein 2018's
/// online softmax; Liu et al. 2023, Ring Attention, §3): with m = max(lse, part_lse),
///   out ← (e^(lse−m)·out + e^(part_lse−m)·part_out) / (e^(lse−m) + e^(part_lse−m)),
///   lse ← m + log(e^(lse−m) + e^(part_lse−m)); a −inf side contributes nothing.
/// Query-side layout of `dims` (q_len, q_seq_rows, lse_seq_len, heads, head_dim) for both
/// pairs; out and part_out have row strides out_stride and part_stride.
void attention_merge(float* out, std::int64_t out_stride, float* lse, const float* part_out,
                     std::int64_t part_stride, const float* part_lse,
                     const AttentionChunkDims& dims);

///   delta (b, h, i) ← Σ_c dout[row, h·d + c] · out[row, h·d + c] (FlashAttention-2's D), for
///   the query rows of `dims`; out and dout share row stride `stride`. Overwritten.
void attention_delta(const float* out, const float* dout, std::int64_t stride,
                     const AttentionChunkDims& dims, float* delta);

/// How attention_chunk_backward writes dq, dk, dv: added to what they hold (several chunk
/// pairs of ring attention sum into them), or overwritten (one call over the whole sequence:
/// the caller need not zero them first, and the kernel reads nothing of them).
enum class GradWrite : std::uint8_t { accumulate, overwrite };

/// Backward of one chunk pair given the FINAL lse and delta of the query rows (over every key
/// chunk, so each pair's P = exp(S − lse) is already normalised): with dS = P∘(dP − D),
///   dq += scale·dS·k,  dk += scale·dSᵀ·q,  dv += Pᵀ·dout   (head columns only),
/// ACCUMULATED, or with GradWrite::overwrite written as if dq, dk, dv held +0 before: bitwise
/// the accumulation into zeroed buffers, whatever they held (NaN included; the chunk's rows
/// and head columns are all written, also under AttentionMask::skip). dout has row stride
/// dout_stride. Rows with lse = −inf add nothing. Summed over several key chunks (ring
/// attention) the gradients equal one call over all keys, up to f32 rounding.
void attention_chunk_backward(const QkvRows& in, const float* dout, std::int64_t dout_stride,
                              const float* lse, const float* delta, const QkvGradRows& grad,
                              const AttentionChunkDims& dims, AttentionMask mask,
                              GradWrite write = GradWrite::accumulate);

// ---------------------------------------------------------------------------------------------
// Rotary position embedding (Su et al. 2021, §3.4.2, eq. 34) in the Hugging Face Llama layout
// ("rotate_half"): within each head, element i < head_dim/2 pairs with i + head_dim/2 and the
// pair is rotated by angle pos·θ^(−2i/head_dim), pos = positions[row].

///   x [rows, heads·head_dim] (row stride `stride` floats) rotated in place; inverse = true
///   rotates by −angle, which is the backward (the rotation is orthogonal). head_dim even.
void rope_apply(float* x, std::int64_t stride, const std::int32_t* positions, std::int64_t rows,
                std::int64_t heads, std::int64_t head_dim, float theta, bool inverse);

// ---------------------------------------------------------------------------------------------
// RMSNorm (Zhang & Sennrich 2019, eq. 4; Hugging Face LlamaRMSNorm):
// y = x · rstd · weight, rstd = 1/√(mean(x²) + eps)

///   x [rows, C]  weight [C]  →  y [rows, C], rstd [rows] (overwritten)
void rmsnorm_forward(const float* x, const float* weight, float* y, float* rstd, std::int64_t rows,
                     std::int64_t C, float eps);
///   dx [rows, C] overwritten; dweight [C] ACCUMULATED
void rmsnorm_backward(const float* x, const float* weight, const float* rstd, const float* dy,
                      float* dx, float* dweight, std::int64_t rows, std::int64_t C);

/// h = a + b; y = RMSNorm(h) in one pass, bitwise equal to add_inplace then rmsnorm_forward.
void residual_rmsnorm_forward(const float* a, const float* b, float* h, const float* weight,
                              float* y, float* rstd, std::int64_t rows, std::int64_t C, float eps);
/// rmsnorm_backward with dx += dresidual (or nullptr) folded in, bitwise equal to the two calls.
void rmsnorm_backward(const float* x, const float* weight, const float* rstd, const float* dy,
                      const float* dresidual, float* dx, float* dweight, std::int64_t rows,
                      std::int64_t C);

// ---------------------------------------------------------------------------------------------
// SwiGLU (Shazeer 2020, eq. 5 with Swish_1 = SiLU): out = silu(gate) · up, silu(g) = g·σ(g).

void swiglu_forward(const float* gate, const float* up, float* out, std::int64_t n);
///   dgate, dup overwritten (may alias gate, up: each element is read before it is written)
void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, std::int64_t n);

// ---------------------------------------------------------------------------------------------
// Sparse mixture of experts (Mixtral, Jiang et al. 2024, §2.1; Hugging Face
// MixtralSparseMoeBlock): the router's softmax and top-k, the row permutation into and out of
// the per-expert packed buffer, and the router's backward. A token n has k assignments
// a = n·k + j (j = 0 … k−1, by decreasing router probability); the layer maps each kept
// assignment to one row of the packed buffer (assign_row[a] ≥ 0) and a dropped one to −1
// (transformer/moe_routing.h). Every output row is owned by one task and summed in a fixed order,
// so results are bitwise the same for every thread count.

///   logits [N, E] f32   →   probs [N, E] = softmax(logits) per row, lse [N] = log Σ exp(logits),
///   top_expert [N, k] i32: the k experts of largest probability, in decreasing order (ties: the
///   lower expert index first, as a stable sort), top_weight [N, k] = their probabilities
///   divided by their sum (Mixtral's renormalisation). All overwritten. MT_CHECKs 1 ≤ k ≤ E.
void moe_router_forward(const float* logits, std::int64_t N, std::int64_t E, std::int64_t k,
                        float* probs, float* lse, std::int32_t* top_expert, float* top_weight);

/// The router's backward, dlogits [N, E] overwritten, as the sum of three terms:
///   top-k weights: w = softmax over the chosen logits, so with g = d_weight [N, k] (∂L/∂w; 0
///     for a dropped assignment) dlogits[n, e_j] += w_j·(g_j − Σ_i w_i·g_i), other experts 0;
///   load balancing (aux_dprob [E] or nullptr): ∂L/∂probs[n, i] = aux_dprob[i] for every n, so
///     dlogits[n, i] += p_i·(aux_dprob[i] − Σ_j p_j·aux_dprob[j]) (softmax backward);
///   z-loss (z_scale = 0: none): dlogits[n, i] += z_scale·lse[n]·p_i (∂lse/∂logits = probs).
void moe_router_backward(const float* probs, const float* lse, const std::int32_t* top_expert,
                         const float* top_weight, const float* d_weight, const float* aux_dprob,
                         float z_scale, float* dlogits, std::int64_t N, std::int64_t E,
                         std::int64_t k);

///   x [N, C], row_token [rows] (0 ≤ token < N)   →   packed [rows, C] overwritten:
///   packed[r] = x[row_token[r]] (the dispatch permutation).
void moe_gather_rows(const float* x, const std::int32_t* row_token, float* packed,
                     std::int64_t rows, std::int64_t C);

///   packed [rows, C] (the experts' outputs), assign_row [N·k], weight [N·k]   →   y [N, C]
///   overwritten: y[n] = Σ_j weight[n·k+j]·packed[assign_row[n·k+j]] over kept assignments, in
///   order j = 0 … k−1 (a token with none gets a zero row).
void moe_combine_forward(const float* packed, const std::int32_t* assign_row, const float* weight,
                         float* y, std::int64_t N, std::int64_t k, std::int64_t C);

/// Backward of moe_combine_forward:  dy [N, C], packed [rows, C] (forward's experts' outputs)  →
///   d_packed [rows, C]: d_packed[assign_row[a]] = weight[a]·dy[n] (rows no assignment names
///   are left untouched; the layer's dispatch names every row once);
///   d_weight [N·k]: ⟨dy[n], packed[assign_row[a]]⟩, 0 for a dropped assignment. Overwritten.
void moe_combine_backward(const float* dy, const float* packed, const std::int32_t* assign_row,
                          const float* weight, float* d_packed, float* d_weight, std::int64_t N,
                          std::int64_t k, std::int64_t C);

///   d_packed [rows, C], assign_row [N·k]   →   dx [N, C] ACCUMULATED: dx[n] += Σ_j
///   d_packed[assign_row[n·k+j]] over kept assignments (the transpose of moe_gather_rows).
void moe_scatter_add_rows(const float* d_packed, const std::int32_t* assign_row, float* dx,
                          std::int64_t N, std::int64_t k, std::int64_t C);

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy over the vocabulary (PyTorch F.cross_entropy, no label smoothing),
// in vocabulary-parallel pieces (Megatron-LM's VocabParallelCrossEntropy, Shoeybi et al. 2019,
// §3): a rank holds logits [rows, V_local] for vocabulary ids [first, first + valid); columns
// [valid, V_local) are padding and never take part. The layer combines the pieces across
// ranks: max → all-reduce max; sum_exp and target_logit → all-reduce sum;
// lse = max + log(sum_exp); loss = lse − target_logit. One shard holding the whole vocabulary
// is first = 0, valid = V_local = V.

///   row_max [rows] = max over the valid columns (−inf when valid == 0) (overwritten)
void vocab_shard_max(const float* logits, std::int64_t rows, std::int64_t V_local,
                     std::int64_t valid, float* row_max);
///   sum_exp [rows] = Σ_{j<valid} exp(logits[r, j] − row_max[r]) (summed in double);
///   target_logit [rows] = logits[r, targets[r] − first] when the target lies in
///   [first, first + valid), else 0 (overwritten). Targets outside [0, ∞) raise.
void vocab_shard_sum_exp(const float* logits, const float* row_max, const std::int32_t* targets,
                         std::int64_t first, std::int64_t rows, std::int64_t V_local,
                         std::int64_t valid, float* sum_exp, float* target_logit);
/// The whole vocabulary on one rank (tp = 1): vocab_shard_max then vocab_shard_sum_exp with
/// first = 0 and valid = V_local = V, in one pass over the rows and bitwise equal to them.
///   logits [rows, V], targets [rows] → row_max, sum_exp, target_logit [rows] (overwritten)
void vocab_softmax_stats(const float* logits, const std::int32_t* targets, std::int64_t rows,
                         std::int64_t V, float* row_max, float* sum_exp, float* target_logit);
///   dlogits[r, j] = scale · (exp(logits[r, j] − lse[r]) − [first + j == targets[r]]) for
///   j < valid, 0 for padding columns; for a mean loss over N rows pass scale = 1/N.
///   dlogits [rows, V_local] overwritten (may alias logits).
void vocab_shard_cross_entropy_backward(const float* logits, const float* lse,
                                        const std::int32_t* targets, std::int64_t first,
                                        float scale, float* dlogits, std::int64_t rows,
                                        std::int64_t V_local, std::int64_t valid);

// ---------------------------------------------------------------------------------------------
// Embedding lookup over a shard of the table (Megatron-LM's VocabParallelEmbedding, Shoeybi et
// al. 2019, §3). The whole table is the shard first = 0, table_rows = its row count.

///   ids [rows]   table [table_rows, C] holding ids [first, first + table_rows)   →
///   out [rows, C] overwritten: out[r] = table[ids[r] − first] for ids inside, a zero row for
///   ids outside (another rank's rows). ids < 0 raise.
void embedding_shard_forward(const std::int32_t* ids, const float* table, std::int64_t first,
                             std::int64_t table_rows, float* out, std::int64_t rows,
                             std::int64_t C);
///   dtable [table_rows, C] ACCUMULATED: dtable[ids[r] − first] += dout[r] for ids inside.
/// embedding_shard_forward from a table of `dtype` (bf16 or f16), each row widened to f32.
void embedding_shard_forward_16bit(const std::int32_t* ids, const std::uint16_t* table, DType dtype,
                                   std::int64_t first, std::int64_t table_rows, float* out,
                                   std::int64_t rows, std::int64_t C);
void embedding_shard_backward(const std::int32_t* ids, const float* dout, std::int64_t first,
                              std::int64_t table_rows, float* dtable, std::int64_t rows,
                              std::int64_t C);

// ---------------------------------------------------------------------------------------------
// Element-wise helpers.

void add(const float* a, const float* b, float* out, std::int64_t n);  // out = a + b
void add_inplace(float* y, const float* x, std::int64_t n);            // y += x
void scale_inplace(float* y, float alpha, std::int64_t n);             // y *= alpha
/// Σ x² accumulated in double (used for the global grad norm).
double sum_squares(const float* x, std::int64_t n);
/// Whether every x[i] is finite (no NaN, no ±inf). One vectorised read pass: the exponent bits
/// are max-reduced as integers, which needs no -ffast-math and no branch per element.
bool all_finite(const float* x, std::int64_t n) noexcept;

// ---------------------------------------------------------------------------------------------
// AdamW (Loshchilov & Hutter 2019, Algorithm 2; moments and bias correction as Kingma & Ba 2015,
// Algorithm 1). Decay as torch.optim.AdamW: w -= lr·weight_decay·w before the Adam update.

struct AdamWParams {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;  // 0 for parameters without decay
  /// Gradient clipping folded into the update: g·grad_scale is what the moments see (1 when
  /// the norm is under the limit). g itself is not scaled in memory: bitwise the same update as
  /// scale_inplace(g, grad_scale) before the step, one pass over the gradients fewer.
  float grad_scale = 1.0f;
};

///   w, m, v [n] f32 updated in place (m, v start at 0); g [n] read (already averaged over dp;
///   clipped through params.grad_scale); step = optimizer steps taken including this one
///   (1-based).
void adamw_step(std::span<float> w, std::span<float> m, std::span<float> v,
                std::span<const float> g, const AdamWParams& params, std::int64_t step);

/// Sets every byte of every span to 0 in one parallel region: each thread clears one
/// contiguous range of the spans' concatenated bytes (cut at multiples of 64 bytes of that
/// order), so a model's many small gradients cost one fork and join in all rather than a serial
/// memset each, and the large ones are cleared by every thread. The spans must not overlap.
void zero_all(std::span<const std::span<std::byte>> spans);

/// One tensor of adamw_step_all: w, m, v [n] updated, g [n] read, with its own params (weight
/// decay differs between tensors).
struct AdamWTensor {
  std::span<float> w, m, v;
  std::span<const float> g;
  AdamWParams params;
  /// Empty, or the same n floats as g, writable: each is set to +0.0f once the update has read
  /// it — the next step's zero_grad folded into this pass. The update is divider-bound (one
  /// sqrt and two divisions per element), so the extra store stream costs less than a separate
  /// memset pass (bench/eltwise_bench: "adamw_step + zero grads" against the two apart).
  std::span<float> zero_g = {};
};
/// adamw_step on every tensor (f32, step 1-based), bitwise the same, in one parallel region
/// over their concatenated elements (AdamW over a flat buffer without copying into one): a
/// model's many small tensors (biases, norm weights) are split across the threads like its
/// large ones. The tensors must not overlap one another, and g must not alias w, m or v (two
/// threads could update the same element). Errors (checked before anything is written): a
/// tensor whose sizes differ, a zero_g that is not g's storage, step < 1.
void adamw_step_all(std::span<const AdamWTensor> tensors, std::int64_t step);

}  // namespace meshtrain::kernels
