#include "meshtrain/parallel/cp/context_attention.h"

#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

using kernels::AttentionChunkDims;
using kernels::AttentionMask;
using kernels::QkvGradRows;
using kernels::QkvRows;

// Adds the scope's wall time to the layer's compute seconds: the kernel work of the core, so
// that the ring's transfer waits (the cp group's counters) can be set against it.
class ComputeTimer {
 public:
  explicit ComputeTimer(double& seconds)
      : seconds_(seconds), start_(std::chrono::steady_clock::now()) {}
  ~ComputeTimer() {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  ComputeTimer(const ComputeTimer&) = delete;
  ComputeTimer& operator=(const ComputeTimer&) = delete;

 private:
  double& seconds_;
  std::chrono::steady_clock::time_point start_;
};

// Separate tag streams on the cp group: K|V blocks, and their dK|dV one step behind.
constexpr int kKvTag = 71;
constexpr int kDkvTag = 72;

void copy_cols(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride,
               std::int64_t rows, std::int64_t width) {
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride,
                static_cast<std::size_t>(width) * sizeof(float));
  }
}

void zero_cols(float* dst, std::int64_t stride, std::int64_t rows, std::int64_t width) {
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memset(dst + r * stride, 0, static_cast<std::size_t>(width) * sizeof(float));
  }
}

// The whole local sequences as one chunk pair (cp = 1, and the a2a core on whole sequences).
AttentionChunkDims whole_dims(std::int64_t sequences, std::int64_t len, std::int64_t heads,
                              std::int64_t kv_heads, std::int64_t head_dim, DType operands) {
  return {.batch = sequences,
          .q_len = len,
          .kv_len = len,
          .heads = heads,
          .kv_heads = kv_heads,
          .head_dim = head_dim,
          .q_offset = 0,
          .kv_offset = 0,
          .q_seq_rows = len,
          .kv_seq_rows = len,
          .lse_seq_len = len,
          .operands = operands};
}

// ---- ring attention (p2p) -------------------------------------------------------------------

// One (local query half, visiting key half) pair of the zigzag split: its mask and the dims
// of the kernel call (rows of each half are T/(2·cp) consecutive rows of every sequence).
struct RingPair {
  int q_half, kv_half;
  AttentionMask mask;
  AttentionChunkDims dims;
};

RingPair ring_pair(const AttentionCoreShape& s, int rank, int src, int size, int q_half,
                   int kv_half) {
  const std::int64_t chunk = s.local_len / 2;
  const int qc = zigzag_chunk(q_half, rank, size), kc = zigzag_chunk(kv_half, src, size);
  const AttentionMask mask = kc < qc    ? AttentionMask::full
                             : kc == qc ? AttentionMask::causal
                                        : AttentionMask::skip;
  return {q_half, kv_half, mask,
          AttentionChunkDims{.batch = s.sequences,
                             .q_len = chunk,
                             .kv_len = chunk,
                             .heads = s.heads,
                             .kv_heads = s.kv_heads,
                             .head_dim = s.head_dim,
                             .q_offset = qc * chunk,
                             .kv_offset = kc * chunk,
                             .q_seq_rows = s.local_len,
                             .kv_seq_rows = s.local_len,
                             .lse_seq_len = s.local_len,
                             .operands = s.operands}};
}

// K | V of the local rows packed as one [tokens, 2·kv_width] block (what travels the ring).
Tensor pack_kv(const QkvRows& in, const AttentionCoreShape& s) {
  const std::int64_t kvw = s.kv_heads * s.head_dim;
  Tensor kv = Tensor::empty({s.tokens(), 2 * kvw}, MemCategory::comm);
  copy_cols(in.k, in.kv_stride, kv.f32(), 2 * kvw, s.tokens(), kvw);
  copy_cols(in.v, in.kv_stride, kv.f32() + kvw, 2 * kvw, s.tokens(), kvw);
  return kv;
}

// Posts the next hop of a block: send `mine` to the next cp rank, receive the previous rank's
// into `incoming`.
struct Hop {
  std::unique_ptr<CommRequest> send, recv;
  // MPI moves a large message only inside MPI calls (the rendezvous protocol): testing the
  // requests between two kernel calls lets the transfer advance while this rank computes.
  void progress() const {
    if (send) send->test();
    if (recv) recv->test();
  }
  void wait() {
    if (send) send->wait();
    if (recv) recv->wait();
    send.reset();
    recv.reset();
  }
};

Hop post_hop(ProcessGroup& g, const Tensor& mine, Tensor& incoming, int tag) {
  const int next = (g.rank() + 1) % g.size(), prev = (g.rank() + g.size() - 1) % g.size();
  Hop hop;
  hop.send = g.isend(mine.span_f32(), next, tag);
  hop.recv = g.irecv(incoming.span_f32(), prev, tag);
  return hop;
}

// Calls fn(pair, q0, k0, rows) for every non-skipped pair of (local query half) × (half of
// the visiting K|V block `kv` of rank `src`): q0 and k0 are the halves' first local rows,
// rows the kernel's view of them.
template <typename Fn>
void for_each_ring_pair(const QkvRows& in, const Tensor& kv, const AttentionCoreShape& s, int rank,
                        int src, int size, const Fn& fn) {
  const std::int64_t kvw = s.kv_heads * s.head_dim;
  const std::int64_t chunk = s.local_len / 2;
  for (int qh = 0; qh < 2; ++qh) {
    for (int kh = 0; kh < 2; ++kh) {
      const RingPair p = ring_pair(s, rank, src, size, qh, kh);
      if (p.mask == AttentionMask::skip) continue;
      const std::int64_t q0 = qh * chunk, k0 = kh * chunk;
      const QkvRows rows{in.q + q0 * in.q_stride, kv.f32() + k0 * 2 * kvw,
                         kv.f32() + k0 * 2 * kvw + kvw, in.q_stride, 2 * kvw};
      fn(p, q0, k0, rows);
    }
  }
}

// out, lse ⊕= the pairs of one ring step, merged by log-sum-exp; part, part_lse are scratch of
// out's and lse's shapes.
void ring_forward_step(const QkvRows& in, const Tensor& kv, Tensor& part, Tensor& part_lse,
                       float* out, float* lse, const AttentionCoreShape& s, int rank, int src,
                       int size, const Hop& hop) {
  const std::int64_t hd = s.heads * s.head_dim;
  for_each_ring_pair(in, kv, s, rank, src, size,
                     [&](const RingPair& p, std::int64_t q0, std::int64_t, const QkvRows& rows) {
                       kernels::attention_chunk_forward(rows, p.dims, p.mask, part.f32() + q0 * hd,
                                                        hd, part_lse.f32() + q0);
                       kernels::attention_merge(out + q0 * hd, hd, lse + q0, part.f32() + q0 * hd,
                                                hd, part_lse.f32() + q0, p.dims);
                       hop.progress();
                     });
}

AttentionCoreState ring_forward(ProcessGroup& g, const QkvRows& in, const AttentionCoreShape& s,
                                float* out, double& compute_s) {
  const std::int64_t hd = s.heads * s.head_dim;
  const int rank = g.rank(), size = g.size();
  AttentionCoreState state;
  state.lse = Tensor::empty({s.sequences, s.heads, s.local_len}, MemCategory::activations);
  float* lse = state.lse.f32();
  std::fill(lse, lse + state.lse.numel(), -std::numeric_limits<float>::infinity());
  zero_cols(out, hd, s.tokens(), hd);
  Tensor part = Tensor::empty({s.tokens(), hd}, MemCategory::activations);
  Tensor part_lse = Tensor::empty(state.lse.shape(), MemCategory::activations);
  Tensor kv = pack_kv(in, s);
  Tensor next_kv = Tensor::empty(kv.shape(), MemCategory::comm);
  for (int step = 0; step < size; ++step) {
    const int src = (rank - step + size) % size;
    Hop hop;
    if (step + 1 < size) hop = post_hop(g, kv, next_kv, kKvTag);  // hidden behind the compute
    {
      const ComputeTimer timer(compute_s);
      ring_forward_step(in, kv, part, part_lse, out, lse, s, rank, src, size, hop);
    }
    hop.wait();
    std::swap(kv, next_kv);
  }
  return state;
}

// dq += and dkv (the visiting block's [tokens, 2·kv_width] gradient) += of one ring step;
// `progress` is called between kernel calls (Hop::progress).
template <typename Progress>
void ring_backward_step(const QkvRows& in, const float* dout, const float* lse, const float* delta,
                        const Tensor& kv, float* dq, std::int64_t dq_stride, Tensor& dkv,
                        const AttentionCoreShape& s, int rank, int src, int size,
                        const Progress& progress) {
  const std::int64_t hd = s.heads * s.head_dim, kvw = s.kv_heads * s.head_dim;
  for_each_ring_pair(
      in, kv, s, rank, src, size,
      [&](const RingPair& p, std::int64_t q0, std::int64_t k0, const QkvRows& rows) {
        float* dkv0 = dkv.f32() + k0 * 2 * kvw;
        const QkvGradRows grads{dq + q0 * dq_stride, dkv0, dkv0 + kvw, dq_stride, 2 * kvw};
        kernels::attention_chunk_backward(rows, dout + q0 * hd, hd, lse + q0, delta + q0, grads,
                                          p.dims, p.mask);
        progress();
      });
}

void ring_backward(ProcessGroup& g, const QkvRows& in, const float* out, const float* dout,
                   const AttentionCoreState& state, const QkvGradRows& grad,
                   const AttentionCoreShape& s, double& compute_s) {
  const std::int64_t hd = s.heads * s.head_dim, kvw = s.kv_heads * s.head_dim;
  const int rank = g.rank(), size = g.size();
  const float* lse = state.lse.f32();
  Tensor delta = Tensor::empty(state.lse.shape(), MemCategory::activations);
  kernels::attention_delta(
      out, dout, hd,
      whole_dims(s.sequences, s.local_len, s.heads, s.kv_heads, s.head_dim, s.operands),
      delta.f32());
  zero_cols(grad.dq, grad.q_stride, s.tokens(), hd);
  Tensor kv = pack_kv(in, s);
  Tensor next_kv = Tensor::empty(kv.shape(), MemCategory::comm);
  // dkv: this step's sum; upstream: the visiting block's sum from the ranks before; sending:
  // the block handed on last step (its transfer overlaps this step's compute).
  Tensor dkv = Tensor::empty(kv.shape(), MemCategory::comm);
  Tensor upstream = Tensor::empty(kv.shape(), MemCategory::comm);
  Tensor sending = Tensor::empty(kv.shape(), MemCategory::comm);
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  std::unique_ptr<CommRequest> dkv_send;
  for (int step = 0; step < size; ++step) {
    const int src = (rank - step + size) % size;
    Hop hop;
    if (step + 1 < size) hop = post_hop(g, kv, next_kv, kKvTag);
    std::unique_ptr<CommRequest> dkv_recv;
    if (step > 0) dkv_recv = g.irecv(upstream.span_f32(), prev, kDkvTag);
    std::memset(dkv.f32(), 0, static_cast<std::size_t>(dkv.numel()) * sizeof(float));
    {
      const ComputeTimer timer(compute_s);
      ring_backward_step(in, dout, lse, delta.f32(), kv, grad.dq, grad.q_stride, dkv, s, rank, src,
                         size, [&] {
                           hop.progress();
                           if (dkv_recv) dkv_recv->test();
                           if (dkv_send) dkv_send->test();
                         });
    }
    if (dkv_recv) {
      dkv_recv->wait();
      kernels::add_inplace(dkv.f32(), upstream.f32(), dkv.numel());
    }
    if (dkv_send) dkv_send->wait();
    std::swap(dkv, sending);
    dkv_send = g.isend(sending.span_f32(), next, kDkvTag);  // the last one goes home
    hop.wait();
    std::swap(kv, next_kv);
  }
  // This rank's own block comes home from the previous rank with every rank's contribution.
  g.irecv(upstream.span_f32(), prev, kDkvTag)->wait();
  dkv_send->wait();
  copy_cols(upstream.f32(), 2 * kvw, grad.dk, grad.kv_stride, s.tokens(), kvw);
  copy_cols(upstream.f32() + kvw, 2 * kvw, grad.dv, grad.kv_stride, s.tokens(), kvw);
}

// ---- Ulysses (a2a) --------------------------------------------------------------------------

// Row of local row `row` of sequence `seq` of cp rank `r` in the whole-sequence layout.
std::int64_t global_row(const AttentionCoreShape& s, int r, int size, std::int64_t seq,
                        std::int64_t row) {
  return seq * s.local_len * size + zigzag_position(row, s.local_len, r, size);
}

// Column blocks of a row that go to head group j: `widths` consecutive column ranges.
struct ColumnBlock {
  const float* src;
  std::int64_t stride, width;  // width = this group's columns (head group j starts at j·width)
};

// Sequence-sharded → head-sharded: every rank sends head group j of its local rows to rank j;
// the rows received from rank r are placed at their global positions of `dst` [B·T, Σ width]
// (blocks side by side in the order given).
void to_heads(ProcessGroup& g, const std::vector<ColumnBlock>& blocks, const AttentionCoreShape& s,
              Tensor& dst) {
  const int size = g.size();
  std::int64_t width = 0;
  for (const ColumnBlock& b : blocks) width += b.width;
  const std::int64_t rows = s.tokens();
  Tensor send = Tensor::empty({size * rows, width}, MemCategory::comm);
  for (int j = 0; j < size; ++j) {
    std::int64_t col = 0;
    for (const ColumnBlock& b : blocks) {
      copy_cols(b.src + j * b.width, b.stride, send.f32() + j * rows * width + col, width, rows,
                b.width);
      col += b.width;
    }
  }
  Tensor recv = Tensor::empty(send.shape(), MemCategory::comm);
  g.all_to_all(send.span_f32(), recv.span_f32());
  for (int r = 0; r < size; ++r) {
    for (std::int64_t seq = 0; seq < s.sequences; ++seq) {
      for (std::int64_t row = 0; row < s.local_len; ++row) {
        const float* from = recv.f32() + (r * rows + seq * s.local_len + row) * width;
        std::memcpy(dst.f32() + global_row(s, r, size, seq, row) * width, from,
                    static_cast<std::size_t>(width) * sizeof(float));
      }
    }
  }
}

// Head-sharded → sequence-sharded, the inverse of to_heads: `src` [B·T, Σ widths] holds this
// rank's head group of every row; block i of it lands in columns [j·width_i, (j+1)·width_i)
// of dsts[i] (row stride dst_strides[i]) for the head group j of the rank it came from.
void to_sequences(ProcessGroup& g, const Tensor& src, const std::vector<std::int64_t>& widths,
                  const std::vector<float*>& dsts, const std::vector<std::int64_t>& dst_strides,
                  const AttentionCoreShape& s) {
  const int size = g.size();
  const std::int64_t rows = s.tokens(), width = src.dim(1);
  Tensor send = Tensor::empty({size * rows, width}, MemCategory::comm);
  for (int r = 0; r < size; ++r) {
    for (std::int64_t seq = 0; seq < s.sequences; ++seq) {
      for (std::int64_t row = 0; row < s.local_len; ++row) {
        std::memcpy(send.f32() + (r * rows + seq * s.local_len + row) * width,
                    src.f32() + global_row(s, r, size, seq, row) * width,
                    static_cast<std::size_t>(width) * sizeof(float));
      }
    }
  }
  Tensor recv = Tensor::empty(send.shape(), MemCategory::comm);
  g.all_to_all(send.span_f32(), recv.span_f32());
  for (int j = 0; j < size; ++j) {
    std::int64_t col = 0;
    for (std::size_t i = 0; i < widths.size(); ++i) {
      copy_cols(recv.f32() + j * rows * width + col, width, dsts[i] + j * widths[i], dst_strides[i],
                rows, widths[i]);
      col += widths[i];
    }
  }
}

AttentionCoreState ulysses_forward(ProcessGroup& g, const QkvRows& in, const AttentionCoreShape& s,
                                   float* out, double& compute_s) {
  const int size = g.size();
  const std::int64_t heads = s.heads / size, kv_heads = s.kv_heads / size, d = s.head_dim;
  const std::int64_t T = s.local_len * size, rows = s.sequences * T;
  AttentionCoreState state;
  Tensor qkv = Tensor::empty({rows, (heads + 2 * kv_heads) * d}, MemCategory::activations);
  to_heads(g,
           {{in.q, in.q_stride, heads * d},
            {in.k, in.kv_stride, kv_heads * d},
            {in.v, in.kv_stride, kv_heads * d}},
           s, qkv);
  // Kept apart so backward's kernel reads q and k|v with plain strides.
  state.q = Tensor::empty({rows, heads * d}, MemCategory::activations);
  state.kv = Tensor::empty({rows, 2 * kv_heads * d}, MemCategory::activations);
  copy_cols(qkv.f32(), qkv.dim(1), state.q.f32(), heads * d, rows, heads * d);
  copy_cols(qkv.f32() + heads * d, qkv.dim(1), state.kv.f32(), 2 * kv_heads * d, rows,
            2 * kv_heads * d);
  qkv = Tensor();
  state.out = Tensor::empty({rows, heads * d}, MemCategory::activations);
  state.lse = Tensor::empty({s.sequences, heads, T}, MemCategory::activations);
  const QkvRows whole{state.q.f32(), state.kv.f32(), state.kv.f32() + kv_heads * d, heads * d,
                      2 * kv_heads * d};
  {
    const ComputeTimer timer(compute_s);
    kernels::attention_chunk_forward(
        whole, whole_dims(s.sequences, T, heads, kv_heads, d, s.operands), AttentionMask::causal,
        state.out.f32(), heads * d, state.lse.f32());
  }
  to_sequences(g, state.out, {heads * d}, {out}, {s.heads * d}, s);
  return state;
}

void ulysses_backward(ProcessGroup& g, const float* dout, const AttentionCoreState& state,
                      const QkvGradRows& grad, const AttentionCoreShape& s, double& compute_s) {
  const int size = g.size();
  const std::int64_t heads = s.heads / size, kv_heads = s.kv_heads / size, d = s.head_dim;
  const std::int64_t T = s.local_len * size, rows = s.sequences * T;
  Tensor dout_heads = Tensor::empty({rows, heads * d}, MemCategory::activations);
  to_heads(g, {{dout, s.heads * d, heads * d}}, s, dout_heads);
  const AttentionChunkDims dims = whole_dims(s.sequences, T, heads, kv_heads, d, s.operands);
  Tensor delta = Tensor::empty(state.lse.shape(), MemCategory::activations);
  kernels::attention_delta(state.out.f32(), dout_heads.f32(), heads * d, dims, delta.f32());
  // dq | dk | dv side by side, the layout to_sequences sends back.
  const std::int64_t width = (heads + 2 * kv_heads) * d;
  Tensor dqkv = Tensor::empty({rows, width}, MemCategory::activations);  // overwritten below
  const QkvRows whole{state.q.f32(), state.kv.f32(), state.kv.f32() + kv_heads * d, heads * d,
                      2 * kv_heads * d};
  const QkvGradRows grads{dqkv.f32(), dqkv.f32() + heads * d, dqkv.f32() + (heads + kv_heads) * d,
                          width, width};
  {
    const ComputeTimer timer(compute_s);
    kernels::attention_chunk_backward(whole, dout_heads.f32(), heads * d, state.lse.f32(),
                                      delta.f32(), grads, dims, AttentionMask::causal,
                                      kernels::GradWrite::overwrite);
  }
  to_sequences(g, dqkv, {heads * d, kv_heads * d, kv_heads * d}, {grad.dq, grad.dk, grad.dv},
               {grad.q_stride, grad.kv_stride, grad.kv_stride}, s);
}

}  // namespace

AttentionCoreState attention_core_forward(const ContextParallel& cp, const QkvRows& in,
                                          const AttentionCoreShape& s, float* out,
                                          double& compute_s) {
  if (cp.size() > 1) {
    MT_CHECK(s.local_len % 2 == 0, "context parallel needs an even local length, got {}",
             s.local_len);
    if (cp.comm == CpCommMode::a2a) return ulysses_forward(*cp.group, in, s, out, compute_s);
    return ring_forward(*cp.group, in, s, out, compute_s);
  }
  AttentionCoreState state;
  state.lse = Tensor::empty({s.sequences, s.heads, s.local_len}, MemCategory::activations);
  const ComputeTimer timer(compute_s);
  kernels::attention_chunk_forward(
      in, whole_dims(s.sequences, s.local_len, s.heads, s.kv_heads, s.head_dim, s.operands),
      AttentionMask::causal, out, s.heads * s.head_dim, state.lse.f32());
  return state;
}

void attention_core_backward(const ContextParallel& cp, const QkvRows& in, const float* out,
                             const float* dout, const AttentionCoreState& state,
                             const QkvGradRows& grad, const AttentionCoreShape& s,
                             double& compute_s) {
  if (cp.size() > 1) {
    if (cp.comm == CpCommMode::a2a) {
      return ulysses_backward(*cp.group, dout, state, grad, s, compute_s);
    }
    return ring_backward(*cp.group, in, out, dout, state, grad, s, compute_s);
  }
  const std::int64_t hd = s.heads * s.head_dim;
  const AttentionChunkDims dims =
      whole_dims(s.sequences, s.local_len, s.heads, s.kv_heads, s.head_dim, s.operands);
  Tensor delta = Tensor::empty(state.lse.shape(), MemCategory::activations);
  const ComputeTimer timer(compute_s);
  kernels::attention_delta(out, dout, hd, dims, delta.f32());
  // One call over the whole sequence writes every head column of dq, dk, dv: no zeroing pass
  // first, and the kernel reads nothing of them.
  kernels::attention_chunk_backward(in, dout, hd, state.lse.f32(), delta.f32(), grad, dims,
                                    AttentionMask::causal, kernels::GradWrite::overwrite);
}

}  // namespace meshtrain
