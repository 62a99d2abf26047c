// src/meshtrain/kernels/cpu/flash_attention_backward.cpp
//
// Chunk-pair attention backward (kernels.h, attention_chunk_backward): FlashAttention-2's
// Algorithm 2 (Dao 2023) from the FINAL lse and D = rowsum(dO∘O) of the query rows, so each
// tile's P = exp(S − lse) is already normalised and tiles of different chunk pairs add up.
//
// Determinism without atomics: two schedules, chosen by fused_backward (flash_tile.h) from the
// task and thread counts, with bitwise the same results:
//   fused, one task per (sequence, kv head): its key blocks in order, each computing the 5 tile
//           products of every visible query block (S, dP, dV, dK and dQ += dS·K), dK and dV
//           in block scratch and dQ of the group's query heads in a task-local [group, q rows,
//           head_dim] buffer, added to the gradient at the end. Used with one thread, or when
//           there are ≥ 2 tasks per thread to balance.
//   two passes in one parallel region, for few (sequence, kv head) pairs on many threads:
//     pass 1, one task per (sequence, kv head, key block): dK and dV of its kBc keys, summed
//             over the group's query heads in head order and their query blocks in order;
//     pass 2, one task per (sequence, query head, query block): dQ of its kBr queries, summed
//             over the key blocks in order, recomputing S, P and dP (7 tile products per tile
//             pair instead of 5).
// Each output element is owned by one task and summed in a fixed order (dQ: over key blocks
// in order, in both schedules; S is scale·Q·Kᵀ with the scale on Q in both), so results are
// bitwise the same for every thread count. The FA-2 paper updates dQ with atomic adds instead,
// which is neither deterministic nor available here.
//
// With S = scale·Q·Kᵀ, P = exp(S − lse) (Algorithm 2, lines 11–16):
//   dV += Pᵀ·dO,  dP = dO·Vᵀ,  dS = P∘(dP − D),  dK += scale·dSᵀ·Q,  dQ += scale·dS·K.
// Each pass lays its tiles out so that the operands it revisits per tile are read as stored:
// pass 1 (and the fused task) packs its K and V block transposed once and computes S and dP
// [queries, keys] from the dO rows in place and a scaled copy of the Q rows; pass 2, like the
// forward (flash_attention.cpp), packs its Q and dO block transposed once and computes Sᵀ and dPᵀ
// [keys, queries] from the K and V rows in place. Pᵀ and dSᵀ are read through strided A operands
// (MatA), never copied. With bf16 operands (flash_operands.h) every tile product reads bf16 copies
// of its operands (Q, K, V, dO and P, dS, rounded after the f32 elementwise step) with f32 sums;
// the loop invariant side of each pass (K, V in pass 1; Q, dO in pass 2) is packed once per task.
// exp is cpu::exp_approx_vec, as in the forward, so P matches the forward's probabilities.
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
  bool overwrite;  // GradWrite::overwrite
};

/// dst[c] += scale·src[c] for c < n, or with overwrite dst[c] = +0 + scale·src[c] without
/// reading dst: bitwise what the addition gives into a zeroed dst. The +0 matters: a sum that
/// underflows to −0 (or a bf16 dot product flushed to −0) must land as +0, as it does when
/// added to a zeroed buffer; both forms contract into the same FMA, and GCC does not fold the
/// +0 away (that would change −0).
void add_scaled(float* dst, const float* src, std::int64_t n, float scale, bool overwrite) {
  if (overwrite) {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = 0.0f + scale * src[c];
  } else {
    for (std::int64_t c = 0; c < n; ++c) dst[c] += scale * src[c];
  }
}

/// Zeroes `width` columns of rows b·seq_rows + i (b < batch, i < len) of a buffer of row stride
/// `stride`: overwrite's result where no key is visible.
void zero_rows(float* x, std::int64_t stride, std::int64_t batch, std::int64_t seq_rows,
               std::int64_t len, std::int64_t width) {
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < len; ++i)
      std::fill_n(x + (b * seq_rows + i) * stride, width, 0.0f);
  }
}

/// Packed operand scratch of a backward task (flash_operands.h; none on the f32 path): slots
/// 0, 1 of [hd, kBr] for the side packed once per task, 2 … 6 of [kBr, hdp] and 7 … 9 of
/// [kBr, kBc] for the operands packed per tile pair (or per key block).
std::size_t operand_slots_floats(TilePath path, std::int64_t hd, std::int64_t hdp) {
  if (path == TilePath::f32) return 0;
  return 2 * operand_floats(hd, kBr) + 5 * operand_floats(kBr, hdp) + 3 * operand_floats(kBr, kBc);
}
float* operand_slot(float* base, int i, std::int64_t hd, std::int64_t hdp) {
  const std::size_t fixed = operand_floats(hd, kBr), tile = operand_floats(kBr, hdp);
  if (i < 2) return base + i * fixed;
  if (i < 7) return base + 2 * fixed + (i - 2) * tile;
  return base + 2 * fixed + 5 * tile + (i - 7) * operand_floats(kBr, kBc);
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
/// key is masked, the query is padding or the row saw no key. On native vectors: exp of every
/// lane then a select, branch-free (dead rows carry lse = 0, a finite argument).
void probs_and_dscores(float* st, float* dpt, std::int64_t bc, const QueryBlock& q,
                       AttentionMask mask, std::int64_t diag) {
  const int n = static_cast<int>(q.nq);  // ≤ kBr, a multiple of kVec
  for (std::int64_t j = 0; j < bc; ++j) {
    const int lo = first_visible(mask, diag, j);
    float* s = st + j * kBr;
    float* dp = dpt + j * kBr;
    for (int c0 = 0; c0 < n; c0 += static_cast<int>(kVec)) {
      const VecI visible = (lane_indices(c0) >= lo) & (load(q.live + c0) != VecF{});
      const VecF e = cpu::exp_approx_vec(load(s + c0) - load(q.lse + c0));
      const VecF p = visible ? e : VecF{};
      store(s + c0, p);
      store(dp + c0, p * (load(dp + c0) - load(q.delta + c0)));
    }
  }
}

/// Pass 1's elementwise step on S and dP [mq queries, nk keys] (row stride kBc): P = exp(S −
/// lse) and dS = P∘(dP − D), 0 where the key is masked or the row saw no key (lse = −inf). On
/// native vectors, exp then a select: branch-free.
void probs_and_dscores_rows(float* s, float* dp, std::int64_t br, std::int64_t bc, std::int64_t nk,
                            const float* lse, const float* delta, AttentionMask mask,
                            std::int64_t diag) {
  const int n = static_cast<int>(nk);  // ≤ kBc, a multiple of kVec
  for (std::int64_t r = 0; r < br; ++r) {
    float* sr = s + r * kBc;
    float* dpr = dp + r * kBc;
    // Query r sees keys j < hi: causal j ≤ r + diag, full every key of the block.
    const std::int64_t vis = mask == AttentionMask::causal ? r + diag + 1 : bc;
    const int hi = lse[r] == kNegInf ? 0 : static_cast<int>(std::clamp<std::int64_t>(vis, 0, bc));
    const float l = lse[r] == kNegInf ? 0.0f : lse[r], dl = delta[r];
    for (int c0 = 0; c0 < n; c0 += static_cast<int>(kVec)) {
      const VecF e = cpu::exp_approx_vec(load(sr + c0) - l);
      const VecF p = lane_indices(c0) < hi ? e : VecF{};
      store(sr + c0, p);
      store(dpr + c0, p * (load(dpr + c0) - dl));
    }
  }
}

/// f32 scratch floats of backward_kv_block: Kᵀ, Vᵀ [hd, kBc]; dK, dV and the K rows [kBc, hdp];
/// scale·Q, Q and dO rows [kBr, hdp]; S and dP [kBr, kBc].
std::size_t kv_block_floats(std::int64_t hd, std::int64_t hdp) {
  return static_cast<std::size_t>(2 * hd * kBc + 3 * kBc * hdp + 3 * kBr * hdp + 2 * kBr * kBc);
}

/// dK, dV of key block kb of kv head kvh of sequence b (added to grad, or written with
/// GradWrite::overwrite), and with dq
/// (the fused schedule) dQ += dS·K of every query block into dq ([group heads][q rows, hdp],
/// unscaled). Tiles are S = (scale·Q)·Kᵀ [queries, keys], the forward's orientation
/// transposed: the block's Kᵀ and Vᵀ are packed once, dO rows are GEMM operands as stored,
/// and the scaled Q rows are a copy per tile pair (O(block), against the tile's O(block²)
/// FLOPs). The products scale·q·k are those of the forward and of pass 2 (which scale Q, not
/// K), so S, P and dS are bitwise pass 2's and the fused dQ is bitwise the two-pass dQ.
void backward_kv_block(const BackwardTask& t, std::int64_t b, std::int64_t kvh, std::int64_t kb,
                       float* scratch, float* dq) {
  const AttentionChunkDims& d = t.d;
  const TilePath path = t.path;
  const std::int64_t hd = d.head_dim, hdp = t.g.hdp;
  const std::int64_t j0 = kb * kBc, bc = std::min(kBc, d.kv_len - j0);
  const std::int64_t mk = round_up(bc, kMR), nk = round_up(mk, kVec);  // ≤ kBc
  float* kt = scratch;
  float* vt = kt + hd * kBc;
  float* dk = vt + hd * kBc;
  float* dv = dk + kBc * hdp;
  float* kn = dv + kBc * hdp;  // K rows when they must be copied
  float* qs = kn + kBc * hdp;  // scale·Q rows
  float* qn = qs + kBr * hdp;  // Q and dO rows when they must be copied
  float* don = qn + kBr * hdp;
  float* s = don + kBr * hdp;
  float* dp = s + kBr * kBc;
  const auto slot = [&](int i) {
    return operand_slot(scratch + kv_block_floats(hd, hdp), i, hd, hdp);
  };
  const std::int64_t kv_row0 = b * d.kv_seq_rows + j0;
  const float* k_src = t.in.k + kv_row0 * t.in.kv_stride + kvh * hd;
  pack_transposed(k_src, t.in.kv_stride, bc, hd, 1.0f, kBc, nk, kt);
  pack_transposed(t.in.v + kv_row0 * t.in.kv_stride + kvh * hd, t.in.kv_stride, bc, hd, 1.0f, kBc,
                  nk, vt);
  const TileB ktb = tile_b(path, kt, kBc, hd, nk, slot(0));
  const TileB vtb = tile_b(path, vt, kBc, hd, nk, slot(1));
  TileB krows{};
  if (dq != nullptr) {
    const Rows k = rows_operand(k_src, t.in.kv_stride, bc, kBc, hd, hdp, kn);
    krows = tile_b(path, k.p, k.ld, bc, hdp, slot(6));
  }
  std::fill(dk, dk + 2 * kBc * hdp, 0.0f);  // dk and dv
  const std::int64_t first_block = visible_q_begin(d, t.mask, j0) / kBr;
  const std::int64_t q_rows = round_up(d.q_len, kMR);
  for (std::int64_t h = kvh * t.g.group; h < (kvh + 1) * t.g.group; ++h) {
    for (std::int64_t qb = first_block; qb < t.g.q_blocks; ++qb) {
      const std::int64_t i0 = qb * kBr, br = std::min(kBr, d.q_len - i0);
      const std::int64_t mq = round_up(br, kMR), row0 = b * d.q_seq_rows + i0;
      const float* q_src = t.in.q + row0 * t.in.q_stride + h * hd;
      const Rows q = rows_operand(q_src, t.in.q_stride, br, kBr, hd, hdp, qn);
      const Rows dout = rows_operand(t.dout + row0 * t.dout_stride + h * hd, t.dout_stride, br, kBr,
                                     hd, hdp, don);
      pack_rows_scaled(q_src, t.in.q_stride, br, hd, t.g.scale, hdp, mq, qs);
      const TileA qa = tile_a(path, {qs, hdp, 1}, mq, hd, slot(2));
      const TileA doa = tile_a(path, {dout.p, dout.ld, 1}, mq, hd, slot(3));
      const std::int64_t diag = d.q_offset + i0 - d.kv_offset - j0;
      const Causal upto = causal_tile(t.mask, Causal::Kind::cols_upto, diag);
      tile_product(path, qa, ktb, s, kBc, mq, nk, hd, false, upto);    // S = (scale·Q)·Kᵀ
      tile_product(path, doa, vtb, dp, kBc, mq, nk, hd, false, upto);  // dP = dO·Vᵀ
      const std::int64_t at = (b * d.heads + h) * d.lse_seq_len + i0;
      probs_and_dscores_rows(s, dp, br, bc, nk, t.lse + at, t.delta + at, t.mask, diag);
      const TileA pa = tile_a(path, {s, 1, kBc}, mk, br, slot(7));
      const TileA dsa = tile_a(path, {dp, 1, kBc}, mk, br, slot(8));
      const TileB dob = tile_b(path, dout.p, dout.ld, br, hdp, slot(4));
      const TileB qb_rows = tile_b(path, q.p, q.ld, br, hdp, slot(5));
      const Causal from = causal_tile(t.mask, Causal::Kind::k_from, diag);
      tile_product(path, pa, dob, dv, hdp, mk, hdp, br, true, from);       // dV += Pᵀ·dO
      tile_product(path, dsa, qb_rows, dk, hdp, mk, hdp, br, true, from);  // dK += dSᵀ·Q
      if (dq != nullptr) {  // dQ += dS·K (pass 2's product, summed in the same key order)
        const TileA ds_rows = tile_a(path, {dp, kBc, 1}, mq, bc, slot(9));
        float* dq_block = dq + ((h - kvh * t.g.group) * q_rows + i0) * hdp;
        tile_product(path, ds_rows, krows, dq_block, hdp, mq, hdp, bc, true,
                     causal_tile(t.mask, Causal::Kind::k_upto, diag));
      }
    }
  }
  for (std::int64_t j = 0; j < bc; ++j) {
    const std::int64_t at = (kv_row0 + j) * t.grad.kv_stride + kvh * hd;
    add_scaled(t.grad.dk + at, dk + j * hdp, hd, t.g.scale, t.overwrite);  // dK = scale·dSᵀ·Q
    add_scaled(t.grad.dv + at, dv + j * hdp, hd, 1.0f, t.overwrite);
  }
}

/// The fused schedule: every key block of kv head kvh of sequence b in order (dK, dV as pass
/// 1) and the dQ of the group's query heads, accumulated over the key blocks in pass 2's order
/// in a task-local [group, q rows, hdp] buffer (no atomics, no reduction across threads), then
/// added as scale·dQ. 5 tile products per tile pair instead of the two passes' 7.
void backward_fused(const BackwardTask& t, std::int64_t b, std::int64_t kvh) {
  const AttentionChunkDims& d = t.d;
  const std::int64_t hd = d.head_dim, hdp = t.g.hdp, q_rows = round_up(d.q_len, kMR);
  const std::size_t block = kv_block_floats(hd, hdp) + operand_slots_floats(t.path, hd, hdp);
  const auto dq_floats = static_cast<std::size_t>(t.g.group * q_rows * hdp);
  float* scratch = cpu::thread_scratch(block + dq_floats);
  float* dq = scratch + block;
  std::fill(dq, dq + dq_floats, 0.0f);
  for (std::int64_t kb = 0; kb < t.g.kv_blocks; ++kb) backward_kv_block(t, b, kvh, kb, scratch, dq);
  for (std::int64_t g = 0; g < t.g.group; ++g) {
    const std::int64_t h = kvh * t.g.group + g;
    for (std::int64_t r = 0; r < d.q_len; ++r) {
      add_scaled(t.grad.dq + (b * d.q_seq_rows + r) * t.grad.q_stride + h * hd,
                 dq + (g * q_rows + r) * hdp, hd, t.g.scale, t.overwrite);
    }
  }
}

/// Pass 2: dQ of query block qb of head h of sequence b (added to grad, or written with
/// GradWrite::overwrite).
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
    const std::int64_t diag = d.q_offset + q.i0 - d.kv_offset - j0;
    const Causal from = causal_tile(t.mask, Causal::Kind::cols_from, diag);
    tile_product(path, ka, qtb, st, kBr, mk, q.nq, hd, false, from);    // Sᵀ
    tile_product(path, va, dotb, dpt, kBr, mk, q.nq, hd, false, from);  // dPᵀ
    probs_and_dscores(st, dpt, bc, q, t.mask, diag);
    const TileA dsa = tile_a(path, {dpt, 1, kBr}, mq, bc, slot(7));
    tile_product(path, dsa, tile_b(path, k.p, k.ld, bc, hdp, slot(4)), dq, hdp, mq, hdp, bc, true,
                 causal_tile(t.mask, Causal::Kind::k_upto, diag));  // dQ += dS·K
  }
  for (std::int64_t r = 0; r < q.br; ++r) {
    add_scaled(t.grad.dq + (b * d.q_seq_rows + q.i0 + r) * t.grad.q_stride + h * hd, dq + r * hdp,
               hd, t.g.scale, t.overwrite);
  }
}

}  // namespace

void cpu::flash::chunk_backward(TilePath path, const QkvRows& in, const float* dout,
                                std::int64_t dout_stride, const float* lse, const float* delta,
                                const QkvGradRows& grad, const AttentionChunkDims& dims,
                                AttentionMask mask, GradWrite write) {
  const ChunkGeometry g =
      check_chunk_dims(dims, in.q_stride, in.kv_stride, dout_stride, "attention_chunk_backward");
  MT_CHECK(grad.q_stride >= dims.heads * dims.head_dim &&
               grad.kv_stride >= dims.kv_heads * dims.head_dim,
           "attention_chunk_backward: gradient row strides dq={} dkv={} narrower than the heads",
           grad.q_stride, grad.kv_stride);
  const bool overwrite = write == GradWrite::overwrite;
  if (mask == AttentionMask::skip) {  // adds nothing
    if (!overwrite) return;
    const std::int64_t B = dims.batch, qw = dims.heads * dims.head_dim;
    const std::int64_t kvw = dims.kv_heads * dims.head_dim;
    zero_rows(grad.dq, grad.q_stride, B, dims.q_seq_rows, dims.q_len, qw);
    zero_rows(grad.dk, grad.kv_stride, B, dims.kv_seq_rows, dims.kv_len, kvw);
    zero_rows(grad.dv, grad.kv_stride, B, dims.kv_seq_rows, dims.kv_len, kvw);
    return;
  }
  const BackwardTask task{in, dout, dout_stride, lse, delta, grad, dims, g, mask, path, overwrite};
  const std::int64_t B = dims.batch, H = dims.heads, KV = dims.kv_heads;
  const bool parallel = B * H * (g.q_blocks + g.kv_blocks) > 1 &&
                        B * H * dims.q_len * dims.kv_len >= cpu::kParallelGrain;
  if (fused_backward(B * KV, parallel ? num_threads() : 1)) {
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (parallel)
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t kvh = 0; kvh < KV; ++kvh) backward_fused(task, b, kvh);
    }
    return;
  }
  // The passes write disjoint outputs (dk, dv vs dq), so threads leave pass 1 without a barrier.
#pragma omp parallel if (parallel)
  {
    float* scratch = cpu::thread_scratch(kv_block_floats(dims.head_dim, g.hdp) +
                                         operand_slots_floats(path, dims.head_dim, g.hdp));
#pragma omp for collapse(3) schedule(dynamic, 1) nowait
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t kvh = 0; kvh < KV; ++kvh) {
        for (std::int64_t kb = 0; kb < g.kv_blocks; ++kb)
          backward_kv_block(task, b, kvh, kb, scratch, nullptr);
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
                              const AttentionChunkDims& dims, AttentionMask mask, GradWrite write) {
  cpu::flash::chunk_backward(tile_path(dims.operands), in, dout, dout_stride, lse, delta, grad,
                             dims, mask, write);
}

}  // namespace meshtrain::kernels
