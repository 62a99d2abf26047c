// src/meshtrain/kernels/cpu/flash_attention_backward.cpp
//
// Chunk-pair attention backward (kernels.h, attention_chunk_backward): FlashAttention-2's
// Algorithm 2 (Dao 2023) from the FINAL lse and D = rowsum(dO∘O) of the query rows, so each
// tile's P = exp(S − lse) is already normalised and tiles of different chunk pairs add up.
//
// Determinism without atomics: the algorithm runs as two passes in one parallel region.
//   pass 1, one task per (sequence, kv head, key block): dK and dV of its kBc keys, summed over
//           the group's query heads in head order and their query blocks in order;
//   pass 2, one task per (sequence, query head, query block): dQ of its kBr queries, summed
//           over the key blocks in order.
// Each output element is owned by one task and summed in a fixed order, so results are bitwise
// the same for every thread count, and the scratch stays O(block) per thread. The price is
// recomputing S, P and dP in pass 2 (7 tile GEMMs per tile pair instead of 5); the FA-2 paper
// instead updates dQ with atomic adds, which is neither deterministic nor available here.
//
// With S = scale·Q·Kᵀ, P = exp(S − lse) (Algorithm 2, lines 11–16):
//   dV += Pᵀ·dO,  dP = dO·Vᵀ,  dS = P∘(dP − D),  dK += scale·dSᵀ·Q,  dQ += scale·dS·K.
// Each pass lays its tiles out so that the operands it revisits per tile are read as stored:
// pass 1 packs its K and V block transposed once and computes S and dP [queries, keys] from
// the Q and dO rows in place; pass 2, like the forward (flash_attention.cpp), packs its Q and
// dO block transposed once and computes Sᵀ and dPᵀ [keys, queries] from the K and V rows in
// place. Pᵀ and dSᵀ are read through strided A operands (MatA), never copied.
// With bf16 operands (flash_operands.h) every tile product reads bf16 copies of its operands
// (Q, K, V, dO and P, dS, rounded after the f32 elementwise step) with f32 sums; the loop
// invariant side of each pass (K, V in pass 1; Q, dO in pass 2) is packed once per task.
// exp is cpu::exp_approx, as in the forward, so P matches the forward's probabilities.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/flash_operands.h"
#include "meshtrain/kernels/cpu/flash_tile.h"
#include "meshtrain/kernels/cpu/vector_math.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

using namespace cpu::flash;  // NOLINT: the private tile vocabulary of this kernel
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct BackwardTask {
  const QkvRows& in;
  const float* dout;
  std::int64_t dout_stride;
  const float* lse;
  const float* delta;
  const QkvGradRows& grad;
  const AttentionChunkDims& d;
  const ChunkGeometry& g;
  AttentionMask mask;
  TilePath path;
};

/// Packed operand scratch of a backward task (flash_operands.h; none on the f32 path): slots
/// 0, 1 of [hd, kBr] for the side packed once per task, 2 … 5 of [kBr, hdp] and 6, 7 of
/// [kBr, kBc] for the operands packed per tile pair.
std::size_t operand_slots_floats(TilePath path, std::int64_t hd, std::int64_t hdp) {
  if (path == TilePath::f32) return 0;
  return 2 * operand_floats(hd, kBr) + 4 * operand_floats(kBr, hdp) + 2 * operand_floats(kBr, kBc);
}
float* operand_slot(float* base, int i, std::int64_t hd, std::int64_t hdp) {
  const std::size_t fixed = operand_floats(hd, kBr), tile = operand_floats(kBr, hdp);
  if (i < 2) return base + i * fixed;
  if (i < 6) return base + 2 * fixed + (i - 2) * tile;
  return base + 2 * fixed + 4 * tile + (i - 6) * operand_floats(kBr, kBc);
}

/// The query side of one tile pair: (scale·Q)ᵀ and dOᵀ [head_dim, kBr], lse and D of the
/// block's queries, live = 1 where lse is finite (a row that saw no key adds nothing).
struct QueryBlock {
  float *qt, *dot, *lse, *delta, *live;
  std::int64_t i0, br, nq;
};

/// Packs the query side of block [i0, i0 + br) of head h of sequence b.
void load_query_block(const BackwardTask& t, std::int64_t b, std::int64_t h, QueryBlock& q) {
  const AttentionChunkDims& d = t.d;
  const std::int64_t hd = d.head_dim;
  const std::int64_t row0 = b * d.q_seq_rows + q.i0;
  pack_transposed(t.in.q + row0 * t.in.q_stride + h * hd, t.in.q_stride, q.br, hd, t.g.scale, kBr,
                  q.nq, q.qt);
  pack_transposed(t.dout + row0 * t.dout_stride + h * hd, t.dout_stride, q.br, hd, 1.0f, kBr, q.nq,
                  q.dot);
  const std::int64_t at = (b * d.heads + h) * d.lse_seq_len + q.i0;
  for (std::int64_t r = 0; r < kBr; ++r) {
    const bool real = r < q.br && t.lse[at + r] != kNegInf;
    q.lse[r] = real ? t.lse[at + r] : 0.0f;
    q.delta[r] = real ? t.delta[at + r] : 0.0f;
    q.live[r] = real ? 1.0f : 0.0f;
  }
}

/// Sᵀ and dPᵀ of one tile [bc keys, nq queries] → Pᵀ (in st) and dSᵀ (in dpt); 0 where the
/// key is masked, the query is padding or the row saw no key.
void probs_and_dscores(float* st, float* dpt, std::int64_t bc, const QueryBlock& q,
                       AttentionMask mask, std::int64_t diag) {
  const int n = static_cast<int>(q.nq);  // ≤ kBr; int lanes as wide as the floats
  const float* live = q.live;
  const float* lse = q.lse;
  const float* delta = q.delta;
  for (std::int64_t j = 0; j < bc; ++j) {
    const int lo = first_visible(mask, diag, j);
    float* s = st + j * kBr;
    float* dp = dpt + j * kBr;
#pragma omp simd
    for (int r = 0; r < n; ++r) {
      // `&` and exp-then-select, not `&&` and a conditional exp: branch-free, so it vectorises
      // (dead rows carry lse = 0, a finite argument).
      const bool visible = (r >= lo) & (live[r] != 0.0f);
      const float e = cpu::exp_approx(s[r] - lse[r]);
      const float p = visible ? e : 0.0f;
      s[r] = p;
      dp[r] = p * (dp[r] - delta[r]);
    }
  }
}

/// Pass 1's elementwise step on S and dP [mq queries, nk keys] (row stride kBc): P = exp(S −
/// lse) and dS = P∘(dP − D), 0 where the key is masked or the row saw no key (lse = −inf).
void probs_and_dscores_rows(float* s, float* dp, std::int64_t br, std::int64_t bc, std::int64_t nk,
                            const float* lse, const float* delta, AttentionMask mask,
                            std::int64_t diag) {
  const int n = static_cast<int>(nk);  // ≤ kBc; int lanes as wide as the floats
  for (std::int64_t r = 0; r < br; ++r) {
    float* sr = s + r * kBc;
    float* dpr = dp + r * kBc;
    // Query r sees keys j < hi: causal j ≤ r + diag, full every key of the block.
    const std::int64_t vis = mask == AttentionMask::causal ? r + diag + 1 : bc;
    const int hi = lse[r] == kNegInf ? 0 : static_cast<int>(std::clamp<std::int64_t>(vis, 0, bc));
    const float l = lse[r] == kNegInf ? 0.0f : lse[r], dl = delta[r];
#pragma omp simd
    for (int c = 0; c < n; ++c) {
      const float e = cpu::exp_approx(sr[c] - l);  // exp then select: branch-free
      const float p = c < hi ? e : 0.0f;
      sr[c] = p;
      dpr[c] = p * (dpr[c] - dl);
    }
  }
}

/// Pass 1: dK, dV of key block kb of kv head kvh of sequence b (ACCUMULATED into grad). Tiles
/// are S = Q·(scale·K)ᵀ [queries, keys] here, the forward's orientation transposed: the task
/// packs its K and V block transposed once, and every query block's Q and dO rows are GEMM
/// operands as stored (A for S and dP, B for dK and dV), with no copy per tile.
void backward_kv_block(const BackwardTask& t, std::int64_t b, std::int64_t kvh, std::int64_t kb) {
  const AttentionChunkDims& d = t.d;
  const TilePath path = t.path;
  const std::int64_t hd = d.head_dim, hdp = t.g.hdp;
  const std::int64_t j0 = kb * kBc, bc = std::min(kBc, d.kv_len - j0);
  const std::int64_t mk = round_up(bc, kMR), nk = round_up(mk, kVec);  // ≤ kBc
  const auto f32_floats =
      static_cast<std::size_t>(2 * hd * kBc + 2 * kBc * hdp + 2 * kBr * hdp + 2 * kBr * kBc);
  float* kt = cpu::thread_scratch(f32_floats + operand_slots_floats(path, hd, hdp));
  float* vt = kt + hd * kBc;
  float* dk = vt + hd * kBc;
  float* dv = dk + kBc * hdp;
  float* qn = dv + kBc * hdp;  // Q and dO rows when they must be copied
  float* don = qn + kBr * hdp;
  float* s = don + kBr * hdp;
  float* dp = s + kBr * kBc;
  const auto slot = [&](int i) { return operand_slot(kt + f32_floats, i, hd, hdp); };
  const std::int64_t kv_row0 = b * d.kv_seq_rows + j0;
  pack_transposed(t.in.k + kv_row0 * t.in.kv_stride + kvh * hd, t.in.kv_stride, bc, hd, t.g.scale,
                  kBc, nk, kt);
  pack_transposed(t.in.v + kv_row0 * t.in.kv_stride + kvh * hd, t.in.kv_stride, bc, hd, 1.0f, kBc,
                  nk, vt);
  const TileB ktb = tile_b(path, kt, kBc, hd, nk, slot(0));
  const TileB vtb = tile_b(path, vt, kBc, hd, nk, slot(1));
  std::fill(dk, dk + 2 * kBc * hdp, 0.0f);  // dk and dv
  const std::int64_t first_block = visible_q_begin(d, t.mask, j0) / kBr;
  for (std::int64_t h = kvh * t.g.group; h < (kvh + 1) * t.g.group; ++h) {
    for (std::int64_t qb = first_block; qb < t.g.q_blocks; ++qb) {
      const std::int64_t i0 = qb * kBr, br = std::min(kBr, d.q_len - i0);
      const std::int64_t mq = round_up(br, kMR), row0 = b * d.q_seq_rows + i0;
      const Rows q =
          rows_operand(t.in.q + row0 * t.in.q_stride + h * hd, t.in.q_stride, br, kBr, hd, hdp, qn);
      const Rows dout = rows_operand(t.dout + row0 * t.dout_stride + h * hd, t.dout_stride, br, kBr,
                                     hd, hdp, don);
      const TileA qa = tile_a(path, {q.p, q.ld, 1}, mq, hd, slot(2));
      const TileA doa = tile_a(path, {dout.p, dout.ld, 1}, mq, hd, slot(3));
      tile_product(path, qa, ktb, s, kBc, mq, nk, hd, false);    // S
      tile_product(path, doa, vtb, dp, kBc, mq, nk, hd, false);  // dP = dO·Vᵀ
      const std::int64_t at = (b * d.heads + h) * d.lse_seq_len + i0;
      probs_and_dscores_rows(s, dp, br, bc, nk, t.lse + at, t.delta + at, t.mask,
                             d.q_offset + i0 - d.kv_offset - j0);
      const TileA pa = tile_a(path, {s, 1, kBc}, mk, br, slot(6));
      const TileA dsa = tile_a(path, {dp, 1, kBc}, mk, br, slot(7));
      const TileB dob = tile_b(path, dout.p, dout.ld, br, hdp, slot(4));
      const TileB qb_rows = tile_b(path, q.p, q.ld, br, hdp, slot(5));
      tile_product(path, pa, dob, dv, hdp, mk, hdp, br, true);       // dV += Pᵀ·dO
      tile_product(path, dsa, qb_rows, dk, hdp, mk, hdp, br, true);  // dK += dSᵀ·Q
    }
  }
  for (std::int64_t j = 0; j < bc; ++j) {
    float* dk_row = t.grad.dk + (kv_row0 + j) * t.grad.kv_stride + kvh * hd;
    float* dv_row = t.grad.dv + (kv_row0 + j) * t.grad.kv_stride + kvh * hd;
    for (std::int64_t c = 0; c < hd; ++c) {
      dk_row[c] += t.g.scale * dk[j * hdp + c];  // dK = scale·dSᵀ·Q
      dv_row[c] += dv[j * hdp + c];
    }
  }
}

/// Pass 2: dQ of query block qb of head h of sequence b (ACCUMULATED into grad).
void backward_q_block(const BackwardTask& t, std::int64_t b, std::int64_t h, std::int64_t qb) {
  const AttentionChunkDims& d = t.d;
  const TilePath path = t.path;
  const std::int64_t hd = d.head_dim, hdp = t.g.hdp, kvh = h / t.g.group;
  const auto f32_floats =
      static_cast<std::size_t>(2 * kBc * hdp + kBr * hdp + 2 * hd * kBr + 2 * kBc * kBr + 3 * kBr);
  float* kp = cpu::thread_scratch(f32_floats + operand_slots_floats(path, hd, hdp));
  float* vp = kp + kBc * hdp;
  float* dq = vp + kBc * hdp;
  float* st = dq + kBr * hdp;
  float* dpt = st + kBc * kBr;
  const auto slot = [&](int i) { return operand_slot(kp + f32_floats, i, hd, hdp); };
  QueryBlock q{dpt + kBc * kBr, nullptr, nullptr, nullptr, nullptr, qb * kBr, 0, 0};
  q.br = std::min(kBr, d.q_len - q.i0);
  q.nq = round_up(q.br, kVec);
  q.dot = q.qt + hd * kBr;
  q.lse = q.dot + hd * kBr;
  q.delta = q.lse + kBr;
  q.live = q.delta + kBr;
  load_query_block(t, b, h, q);
  const TileB qtb = tile_b(path, q.qt, kBr, hd, q.nq, slot(0));
  const TileB dotb = tile_b(path, q.dot, kBr, hd, q.nq, slot(1));
  std::fill(dq, dq + kBr * hdp, 0.0f);
  const std::int64_t mq = round_up(q.br, kMR);
  const float* k_rows = t.in.k + b * d.kv_seq_rows * t.in.kv_stride + kvh * hd;
  const float* v_rows = t.in.v + b * d.kv_seq_rows * t.in.kv_stride + kvh * hd;
  const std::int64_t kv_end = visible_kv_end(d, t.mask, q.i0, q.br);
  for (std::int64_t j0 = 0; j0 < kv_end; j0 += kBc) {
    const std::int64_t bc = std::min(kBc, kv_end - j0), mk = round_up(bc, kMR);
    const Rows k = rows_operand(k_rows + j0 * t.in.kv_stride, t.in.kv_stride, bc, kBc, hd, hdp, kp);
    const Rows v = rows_operand(v_rows + j0 * t.in.kv_stride, t.in.kv_stride, bc, kBc, hd, hdp, vp);
    const TileA ka = tile_a(path, {k.p, k.ld, 1}, mk, hd, slot(2));
    const TileA va = tile_a(path, {v.p, v.ld, 1}, mk, hd, slot(3));
    tile_product(path, ka, qtb, st, kBr, mk, q.nq, hd, false);    // Sᵀ
    tile_product(path, va, dotb, dpt, kBr, mk, q.nq, hd, false);  // dPᵀ
    probs_and_dscores(st, dpt, bc, q, t.mask, d.q_offset + q.i0 - d.kv_offset - j0);
    const TileA dsa = tile_a(path, {dpt, 1, kBr}, mq, bc, slot(6));
    tile_product(path, dsa, tile_b(path, k.p, k.ld, bc, hdp, slot(4)), dq, hdp, mq, hdp, bc,
                 true);  // dQ += dS·K
  }
  for (std::int64_t r = 0; r < q.br; ++r) {
    float* dq_row = t.grad.dq + (b * d.q_seq_rows + q.i0 + r) * t.grad.q_stride + h * hd;
    for (std::int64_t c = 0; c < hd; ++c) dq_row[c] += t.g.scale * dq[r * hdp + c];
  }
}

}  // namespace

void cpu::flash::chunk_backward(TilePath path, const QkvRows& in, const float* dout,
                                std::int64_t dout_stride, const float* lse, const float* delta,
                                const QkvGradRows& grad, const AttentionChunkDims& dims,
                                AttentionMask mask) {
  const ChunkGeometry g =
      check_chunk_dims(dims, in.q_stride, in.kv_stride, dout_stride, "attention_chunk_backward");
  MT_CHECK(grad.q_stride >= dims.heads * dims.head_dim &&
               grad.kv_stride >= dims.kv_heads * dims.head_dim,
           "attention_chunk_backward: gradient row strides dq={} dkv={} narrower than the heads",
           grad.q_stride, grad.kv_stride);
  if (mask == AttentionMask::skip) return;
  const BackwardTask task{in, dout, dout_stride, lse, delta, grad, dims, g, mask, path};
  const std::int64_t B = dims.batch, H = dims.heads, KV = dims.kv_heads;
  const bool parallel = B * H * (g.q_blocks + g.kv_blocks) > 1 &&
                        B * H * dims.q_len * dims.kv_len >= cpu::kParallelGrain;
  // The passes write disjoint outputs (dk, dv vs dq), so threads leave pass 1 without a barrier.
#pragma omp parallel if (parallel)
  {
#pragma omp for collapse(3) schedule(dynamic, 1) nowait
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t kvh = 0; kvh < KV; ++kvh) {
        for (std::int64_t kb = 0; kb < g.kv_blocks; ++kb) backward_kv_block(task, b, kvh, kb);
      }
    }
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t qb = 0; qb < g.q_blocks; ++qb) backward_q_block(task, b, h, qb);
      }
    }
  }
}

void attention_chunk_backward(const QkvRows& in, const float* dout, std::int64_t dout_stride,
                              const float* lse, const float* delta, const QkvGradRows& grad,
                              const AttentionChunkDims& dims, AttentionMask mask) {
  cpu::flash::chunk_backward(tile_path(dims.operands), in, dout, dout_stride, lse, delta, grad,
                             dims, mask);
}

}  // namespace meshtrain::kernels
