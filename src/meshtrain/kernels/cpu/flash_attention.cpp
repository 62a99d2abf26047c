// src/meshtrain/kernels/cpu/flash_attention.cpp
//
// Chunk-pair attention forward, the log-sum-exp merge and D = rowsum(dO∘O) (kernels.h,
// attention_chunk_forward / attention_merge / attention_delta); the backward is in
// flash_attention_backward.cpp, the shared tiles in flash_tile.h.
//
// Forward is FlashAttention-2's Algorithm 1 (Dao 2023): one task per (sequence, query head,
// block of kBr queries) walks the key blocks of kBc keys in order, keeping the running row max
// m, the running sum l and the unnormalised output O of its queries in block scratch (online
// softmax, Milakov & Gimelshein 2018), and writes O/l and lse = m + log l at the end. Nothing
// O(T²) exists; the scratch is O(kBr·head_dim + kBc·head_dim + kBr·kBc) floats per thread.
//
// A tile computes Sᵀ = K·(scale·Q)ᵀ, [kBc keys, kBr queries], not S: K's rows are then the A
// operand as they are stored (no transposed copy per key block), Qᵀ is packed once per task,
// and the softmax statistics of the block's queries are vectors over the tile's columns, so
// max, exp and sum vectorise without horizontal reductions. O += P·V then reads P through
// Sᵀ's storage (MatA {st, 1, kBr}).
//
// With bf16 operands (flash_operands.h) the two tile products read bf16(K), bf16(scale·Q) and
// bf16(P̃), bf16(V) with f32 sums; m, l (summed from the f32 P̃) and O stay f32.
// exp is cpu::exp_approx_vec on native vectors, bitwise cpu::exp_approx (< 1 ulp,
// vector_math.h), the same exp as gqa_attention_forward.
// Tasks write disjoint rows and columns and run their tile loop in a fixed order, so the result
// is bitwise the same for every thread count (dynamic scheduling only balances the causal
// triangle, whose query blocks see different numbers of key blocks).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/cpu_util.h"
#include "meshtrain/kernels/cpu/flash_operands.h"
#include "meshtrain/kernels/cpu/flash_tile.h"
#include "meshtrain/kernels/cpu/vector_math.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {
namespace {

using namespace cpu::flash;  // NOLINT: the private tile vocabulary of this kernel
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Block scratch of one forward task (floats, carved from cpu::thread_scratch).
struct ForwardScratch {
  float *qt, *kp, *vp, *st, *o, *m, *l, *alpha;
  static std::size_t floats(std::int64_t hd, std::int64_t hdp) {
    return static_cast<std::size_t>(hd * kBr + 2 * kBc * hdp + kBc * kBr + kBr * hdp + 3 * kBr);
  }
  static ForwardScratch carve(float* p, std::int64_t hd, std::int64_t hdp) {
    ForwardScratch s{};
    s.qt = p;
    s.kp = s.qt + hd * kBr;
    s.vp = s.kp + kBc * hdp;
    s.st = s.vp + kBc * hdp;
    s.o = s.st + kBc * kBr;
    s.m = s.o + kBr * hdp;
    s.l = s.m + kBr;
    s.alpha = s.l + kBr;
    return s;
  }
};

/// Scratch of the packed tile operands (flash_operands.h; none on the f32 path): the B
/// operand (scale·Q)ᵀ, packed once per task, and K, P̃, V, packed per tile.
struct ForwardOperands {
  float *qt, *k, *p, *v;
  static std::size_t floats(TilePath path, std::int64_t hd, std::int64_t hdp) {
    if (path == TilePath::f32) return 0;
    return operand_floats(hd, kBr) + 2 * operand_floats(kBc, hdp) + operand_floats(kBr, kBc);
  }
  static ForwardOperands carve(float* p, std::int64_t hd, std::int64_t hdp) {
    ForwardOperands s{};
    s.qt = p;
    s.k = s.qt + operand_floats(hd, kBr);
    s.v = s.k + operand_floats(kBc, hdp);
    s.p = s.v + operand_floats(kBc, hdp);
    return s;
  }
};

/// Online softmax over NB column vectors [c0, c0 + NB·kVec) of one tile (online_softmax below):
/// the vectors' running max m and sum l stay in registers across the tile's key rows. Two
/// vectors per call run two independent max and sum chains side by side; the rows of one
/// column are still visited in order, so every sum adds its terms in the order of the
/// element-by-element loop it replaces and the result is bitwise the same.
template <int NB>
void online_softmax_columns(float* st, std::int64_t bc, int hi, int c0, AttentionMask mask,
                            std::int64_t diag, float* m, float* l, float* alpha) {
  constexpr int kV = static_cast<int>(kVec);
  VecI col[NB];
  VecF m_old[NB], m_new[NB], sum[NB];
  for (int v = 0; v < NB; ++v) {
    col[v] = lane_indices(c0 + v * kV);
    m_old[v] = m_new[v] = load(m + c0 + v * kV);
  }
  const int end = c0 + NB * kV;  // columns [c0, end)
  const bool padded = end > hi;  // some columns are padding past the block's queries
  // Key row j is visible to columns ≥ lo (first_visible), and lo never decreases with j: a row
  // with lo ≥ end is masked for every column here, and so is every row after it.
  for (std::int64_t j = 0; j < bc; ++j) {
    const int lo = first_visible(mask, diag, j);
    if (lo >= end) break;
    const float* s = st + j * kBr + c0;
    for (int v = 0; v < NB; ++v) {
      const VecF x = load(s + v * kV);
      if (lo <= c0 && !padded) {
        m_new[v] = x > m_new[v] ? x : m_new[v];
      } else {
        const VecI visible = (col[v] >= lo) & (col[v] < hi);
        m_new[v] = (visible & (x > m_new[v])) ? x : m_new[v];
      }
    }
  }
  // A column that has seen no key keeps m = −inf: its factor is 1 (−inf − −inf would be NaN),
  // its P entries are 0 below and its O and l stay 0.
  for (int v = 0; v < NB; ++v) {
    const VecF a = cpu::exp_approx_vec(m_old[v] == m_new[v] ? VecF{} : m_old[v] - m_new[v]);
    store(m + c0 + v * kV, m_new[v]);
    store(alpha + c0 + v * kV, a);
    sum[v] = load(l + c0 + v * kV) * a;
  }
  for (std::int64_t j = 0; j < bc; ++j) {
    const int lo = first_visible(mask, diag, j);
    float* s = st + j * kBr + c0;
    for (int v = 0; v < NB; ++v) {
      VecF p{};  // a row masked for the whole vector: P̃ = 0 and l += 0
      if (lo < c0 + (v + 1) * kV) {
        const VecF x = load(s + v * kV) - m_new[v];
        if (lo <= c0 && !padded) {
          p = cpu::exp_approx_vec(x);
        } else {
          // exp of every lane, then a select; masked lanes get a finite argument (x may be
          // −inf − −inf = NaN there).
          const VecI visible = (col[v] >= lo) & (col[v] < hi);
          p = cpu::exp_approx_vec(visible ? x : VecF{} - 100.0f);
          p = visible ? p : VecF{};
        }
      }
      store(s + v * kV, p);
      sum[v] += p;
    }
  }
  for (int v = 0; v < NB; ++v) store(l + c0 + v * kV, sum[v]);
}

/// Online softmax over one tile (Algorithm 1, lines 8–10). st holds Sᵀ [bc keys, nq queries]
/// (row stride kBr), columns [br, nq) padding; on return it holds P̃ᵀ = exp(S − m_new) with 0
/// wherever a key is masked, m is the new running max, l the rescaled running sum plus this tile's
/// row sums, and alpha the factor e^(m_old − m_new) the caller applies to O.
///
/// The statistics of the block's queries are vectors over the tile's columns: each vector's
/// max and sum are register chains over the key rows (online_softmax_columns), two vectors at
/// a time. Rows masked for a whole vector skip its exp, and vectors every row sees skip the
/// mask's compares and selects; neither changes a bit (a masked entry leaves m as it is, adds
/// +0 to l and has P̃ = 0 either way).
void online_softmax(float* st, std::int64_t bc, std::int64_t br, std::int64_t nq,
                    AttentionMask mask, std::int64_t diag, float* m, float* l, float* alpha) {
  const int n = static_cast<int>(nq), hi = static_cast<int>(br);  // ≤ kBr
  int c0 = 0;
  for (; c0 + 2 * kVec <= n; c0 += 2 * kVec)
    online_softmax_columns<2>(st, bc, hi, c0, mask, diag, m, l, alpha);
  if (c0 < n) online_softmax_columns<1>(st, bc, hi, c0, mask, diag, m, l, alpha);
}

struct ForwardTask {
  const QkvRows& in;
  const AttentionChunkDims& d;
  const ChunkGeometry& g;
  AttentionMask mask;
  float* out;
  std::int64_t out_stride;
  float* lse;
  TilePath path;
};

/// One (sequence b, query head h, query block qb) of Algorithm 1.
void forward_block(const ForwardTask& t, std::int64_t b, std::int64_t h, std::int64_t qb) {
  const AttentionChunkDims& d = t.d;
  const std::int64_t hd = d.head_dim, hdp = t.g.hdp;
  const std::int64_t i0 = qb * kBr, br = std::min(kBr, d.q_len - i0);
  const std::int64_t nq = round_up(br, kVec), mq = round_up(br, kMR);
  const std::int64_t kvh = h / t.g.group;
  const TilePath path = t.path;
  const std::size_t f32_floats = ForwardScratch::floats(hd, hdp);
  float* scratch = cpu::thread_scratch(f32_floats + ForwardOperands::floats(path, hd, hdp));
  const ForwardScratch s = ForwardScratch::carve(scratch, hd, hdp);
  const ForwardOperands op = ForwardOperands::carve(scratch + f32_floats, hd, hdp);
  pack_transposed(t.in.q + (b * d.q_seq_rows + i0) * t.in.q_stride + h * hd, t.in.q_stride, br, hd,
                  t.g.scale, kBr, nq, s.qt);
  const TileB qt = tile_b(path, s.qt, kBr, hd, nq, op.qt);
  std::fill(s.o, s.o + kBr * hdp, 0.0f);
  std::fill(s.m, s.m + kBr, kNegInf);
  std::fill(s.l, s.l + kBr, 0.0f);
  const float* k_rows = t.in.k + b * d.kv_seq_rows * t.in.kv_stride + kvh * hd;
  const float* v_rows = t.in.v + b * d.kv_seq_rows * t.in.kv_stride + kvh * hd;
  const std::int64_t kv_end = visible_kv_end(d, t.mask, i0, br);
  for (std::int64_t j0 = 0; j0 < kv_end; j0 += kBc) {
    const std::int64_t bc = std::min(kBc, kv_end - j0), mk = round_up(bc, kMR);
    const Rows k =
        rows_operand(k_rows + j0 * t.in.kv_stride, t.in.kv_stride, bc, kBc, hd, hdp, s.kp);
    const Rows v =
        rows_operand(v_rows + j0 * t.in.kv_stride, t.in.kv_stride, bc, kBc, hd, hdp, s.vp);
    const TileA ka = tile_a(path, {k.p, k.ld, 1}, mk, hd, op.k);
    const std::int64_t diag = d.q_offset + i0 - d.kv_offset - j0;
    tile_product(path, ka, qt, s.st, kBr, mk, nq, hd, false,
                 causal_tile(t.mask, Causal::Kind::cols_from, diag));  // Sᵀ = K·(scale·Q)ᵀ
    online_softmax(s.st, bc, br, nq, t.mask, diag, s.m, s.l, s.alpha);
    for (std::int64_t r = 0; r < br; ++r) {
      if (s.alpha[r] == 1.0f) continue;
      float* o = s.o + r * hdp;
      const float a = s.alpha[r];
#pragma omp simd
      for (std::int64_t c = 0; c < hdp; ++c) o[c] *= a;
    }
    const TileA pa = tile_a(path, {s.st, 1, kBr}, mq, bc, op.p);
    tile_product(path, pa, tile_b(path, v.p, v.ld, bc, hdp, op.v), s.o, hdp, mq, hdp, bc, true,
                 causal_tile(t.mask, Causal::Kind::k_upto, diag));  // O += P̃·V
  }
  for (std::int64_t r = 0; r < br; ++r) {  // Algorithm 1, lines 12–13
    float* o = t.out + (b * d.q_seq_rows + i0 + r) * t.out_stride + h * hd;
    float* lse = t.lse + (b * d.heads + h) * d.lse_seq_len + i0 + r;
    if (s.l[r] > 0.0f) {
      const float inv = 1.0f / s.l[r];
      for (std::int64_t c = 0; c < hd; ++c) o[c] = s.o[r * hdp + c] * inv;
      *lse = s.m[r] + std::log(s.l[r]);
    } else {  // the row saw no key
      std::fill(o, o + hd, 0.0f);
      *lse = kNegInf;
    }
  }
}

}  // namespace

void cpu::flash::chunk_forward(TilePath path, const QkvRows& in, const AttentionChunkDims& dims,
                               AttentionMask mask, float* out, std::int64_t out_stride,
                               float* lse) {
  const ChunkGeometry g =
      check_chunk_dims(dims, in.q_stride, in.kv_stride, out_stride, "attention_chunk_forward");
  const ForwardTask task{in, dims, g, mask, out, out_stride, lse, path};
  const std::int64_t B = dims.batch, H = dims.heads, nqb = g.q_blocks;
  // Tiny calls (a decode step, a test with T = 1) stay on the calling thread.
  const bool parallel = B * H * nqb > 1 && B * H * dims.q_len * dims.kv_len >= cpu::kParallelGrain;
#pragma omp parallel for collapse(3) schedule(dynamic, 1) if (parallel)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t qb = 0; qb < nqb; ++qb) forward_block(task, b, h, qb);
    }
  }
}

void attention_chunk_forward(const QkvRows& in, const AttentionChunkDims& dims, AttentionMask mask,
                             float* out, std::int64_t out_stride, float* lse) {
  cpu::flash::chunk_forward(tile_path(dims.operands), in, dims, mask, out, out_stride, lse);
}

void attention_merge(float* out, std::int64_t out_stride, float* lse, const float* part_out,
                     std::int64_t part_stride, const float* part_lse,
                     const AttentionChunkDims& dims) {
  check_query_dims(dims, "attention_merge");
  const std::int64_t hd = dims.head_dim, C = dims.heads * hd;
  MT_CHECK(out_stride >= C && part_stride >= C,
           "attention_merge: row strides out={} part={} narrower than heads·head_dim={}",
           out_stride, part_stride, C);
  const std::int64_t B = dims.batch, H = dims.heads;
#pragma omp parallel for collapse(2) schedule(static) if (B * dims.q_len * C >= cpu::kParallelGrain)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < dims.q_len; ++i) {
      const std::int64_t row = b * dims.q_seq_rows + i;
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t at = (b * H + h) * dims.lse_seq_len + i;
        const float la = lse[at], lb = part_lse[at];
        if (lb == kNegInf) continue;  // the part saw no key: nothing to add
        float* o = out + row * out_stride + h * hd;
        const float* po = part_out + row * part_stride + h * hd;
        if (la == kNegInf) {  // this side saw no key yet: take the part as it is
          std::copy(po, po + hd, o);
          lse[at] = lb;
          continue;
        }
        // With m the larger lse, one weight is 1 and the other e^(−|la − lb|) ≤ 1: no overflow.
        const float mx = std::max(la, lb);
        const float wa = std::exp(la - mx), wb = std::exp(lb - mx);
        const float inv = 1.0f / (wa + wb);
        const float ca = wa * inv, cb = wb * inv;
        for (std::int64_t c = 0; c < hd; ++c) o[c] = ca * o[c] + cb * po[c];
        lse[at] = mx + std::log(wa + wb);
      }
    }
  }
}

void attention_delta(const float* out, const float* dout, std::int64_t stride,
                     const AttentionChunkDims& dims, float* delta) {
  check_query_dims(dims, "attention_delta");
  const std::int64_t hd = dims.head_dim, C = dims.heads * hd, B = dims.batch, H = dims.heads;
  MT_CHECK(stride >= C, "attention_delta: row stride {} narrower than heads·head_dim={}", stride,
           C);
  // Each entry sums its head_dim products in column order, on one thread: bitwise the same for
  // every thread count.
#pragma omp parallel for collapse(2) schedule(static) if (B * dims.q_len * C >= cpu::kParallelGrain)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < dims.q_len; ++i) {
      const std::int64_t row = b * dims.q_seq_rows + i;
      for (std::int64_t h = 0; h < H; ++h) {
        const float* o = out + row * stride + h * hd;
        const float* g = dout + row * stride + h * hd;
        float acc = 0.0f;
        for (std::int64_t c = 0; c < hd; ++c) acc += g[c] * o[c];
        delta[(b * H + h) * dims.lse_seq_len + i] = acc;
      }
    }
  }
}

}  // namespace meshtrain::kernels
