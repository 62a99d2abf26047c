#include "meshtrain/transformer/moe.h"

#include <fmt/format.h>

#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/autocast.h"
#include "meshtrain/layers/weight_grad_queue.h"

namespace meshtrain {

// ---------------------------------------------------------------------------------------------
// GroupedSwiGluExperts

namespace {

// Whether ep rank `rank` holds `record`: it is not owned along ep, or owned by that rank.
bool on_ep_rank(const ParamPlacement& record, int rank) {
  const AxisPlacement& ep = record.on(Axis::ep);
  return ep.kind != PlacementKind::owned || ep.owner == rank;
}

}  // namespace

GroupedSwiGluExperts::GroupedSwiGluExperts(const std::string& prefix, std::int64_t experts,
                                           const PlacementTable& records, int ep_rank,
                                           int ep_size, float init_std, float proj_init_std,
                                           ParameterStorage storage) {
  std::int64_t first = -1;
  for (std::int64_t j = 0; j < experts; ++j) {
    const std::string e = fmt::format("{}.{}", prefix, j);
    const ParamPlacement& w1 = records.at(e + ".w1.weight");
    if (!on_ep_rank(w1, ep_rank)) continue;
    if (first < 0) first = j;
    experts_.push_back(Expert{.w1 = Parameter(w1, 0, 1, InitKind::normal, init_std, storage),
                              .w3 = Parameter(records.at(e + ".w3.weight"), 0, 1,
                                              InitKind::normal, init_std, storage),
                              .w2 = Parameter(records.at(e + ".w2.weight"), 0, 1,
                                              InitKind::normal, proj_init_std, storage)});
  }
  const auto count = static_cast<std::int64_t>(experts_.size());
  MT_CHECK(ep_size >= 1 && count >= 1 && count * ep_size == experts &&
               first == ep_rank * count,
           "{}: ep rank {} of {} holds experts [{}, +{}) of {}, not its block of E/ep",
           prefix, ep_rank, ep_size, first, count, experts);
  const Shape& w1 = experts_.front().w1.shard.logical_shape;
  hidden_ = w1.at(0);
  n_embd_ = w1.at(1);
  for (const Expert& ex : experts_) {
    MT_CHECK(ex.w1.shard.logical_shape == w1 && ex.w3.shard.logical_shape == w1 &&
                 ex.w2.shard.logical_shape == Shape({n_embd_, hidden_}),
             "{}: expert shapes {} {} {} (w1, w3 [F, C], w2 [C, F])", ex.w1.name,
             to_string(ex.w1.shard.logical_shape), to_string(ex.w3.shard.logical_shape),
             to_string(ex.w2.shard.logical_shape));
  }
}

Tensor GroupedSwiGluExperts::forward(const Tensor& packed, std::span<const std::int64_t> counts,
                                     const MicroBatchContext& ctx) {
  MT_CHECK(packed.ndim() == 2 && packed.dim(1) == n_embd_ && counts.size() == experts_.size(),
           "{}: packed {} with {} counts for {} experts of C={}", experts_.front().w1.name,
           to_string(packed.shape()), counts.size(), experts_.size(), n_embd_);
  State& s = saved_.at(ctx.slot);
  s.offsets.assign(1, 0);
  for (const std::int64_t c : counts) s.offsets.push_back(s.offsets.back() + c);
  const std::int64_t rows = packed.dim(0);
  MT_CHECK(s.offsets.back() == rows, "{}: counts sum to {}, packed has {} rows",
           experts_.front().w1.name, s.offsets.back(), rows);
  s.gate = Tensor::empty({rows, hidden_}, MemCategory::activations);
  s.up = Tensor::empty({rows, hidden_}, MemCategory::activations);
  Tensor out = Tensor::empty({rows, n_embd_}, MemCategory::activations);
  s.x_in.assign(experts_.size(), Tensor());
  s.act_in.assign(experts_.size(), Tensor());
  for (std::size_t e = 0; e < experts_.size(); ++e) {
    const std::int64_t begin = s.offsets[e], end = s.offsets[e + 1];
    if (begin == end) continue;  // no rows: no GEMM (and nothing kept)
    Expert& ex = experts_[e];
    s.x_in[e] = matmul_input(packed.rows(begin, end), ex.w1);
    Tensor gate = s.gate.rows(begin, end), up = s.up.rows(begin, end);
    autocast_linear_forward(s.x_in[e], ex.w1, nullptr, gate);
    autocast_linear_forward(s.x_in[e], ex.w3, nullptr, up);
    Tensor act = Tensor::empty(gate.shape(), MemCategory::activations);
    kernels::swiglu_forward(gate.f32(), up.f32(), act.f32(), act.numel());
    s.act_in[e] = matmul_input(act, ex.w2);
    Tensor y = out.rows(begin, end);
    autocast_linear_forward(s.act_in[e], ex.w2, nullptr, y);
  }
  return out;
}

Tensor GroupedSwiGluExperts::backward(const Tensor& d_out, const MicroBatchContext& ctx) {
  State s = saved_.take(ctx.slot, experts_.front().w1.name);
  const std::int64_t rows = s.offsets.back();
  MT_CHECK(d_out.ndim() == 2 && d_out.dim(0) == rows && d_out.dim(1) == n_embd_,
           "{}: gradient {} for [{}, {}]", experts_.front().w1.name, to_string(d_out.shape()), rows,
           n_embd_);
  Tensor d_packed = Tensor::empty({rows, n_embd_}, MemCategory::activations);
  for (std::size_t e = 0; e < experts_.size(); ++e) {
    const std::int64_t begin = s.offsets[e], end = s.offsets[e + 1], n = end - begin;
    if (n == 0) continue;
    Expert& ex = experts_[e];
    Tensor d_act = Tensor::empty({n, hidden_}, MemCategory::activations);
    linear_backward_or_defer(s.act_in[e], ex.w2, d_out.rows(begin, end), d_act.f32(), nullptr,
                             {n, hidden_, n_embd_}, ctx);
    // In place, as SwiGluMlp: gate and up become their gradients (a deferred w1/w3 gradient
    // keeps them until W).
    Tensor gate = s.gate.rows(begin, end), up = s.up.rows(begin, end);
    kernels::swiglu_backward(gate.f32(), up.f32(), d_act.f32(), gate.f32(), up.f32(), gate.numel());
    Tensor dx = d_packed.rows(begin, end);
    linear_backward_or_defer(s.x_in[e], ex.w1, gate, dx.f32(), nullptr, {n, n_embd_, hidden_}, ctx);
    Tensor dx_up = Tensor::empty({n, n_embd_}, MemCategory::activations);
    linear_backward_or_defer(s.x_in[e], ex.w3, up, dx_up.f32(), nullptr, {n, n_embd_, hidden_},
                             ctx);
    kernels::add_inplace(dx.f32(), dx_up.f32(), dx.numel());
  }
  return d_packed;
}

ParameterList GroupedSwiGluExperts::parameters() {
  ParameterList out;
  for (Expert& e : experts_) {
    for (Parameter* p : {&e.w1, &e.w3, &e.w2}) out.push_back(p);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// SparseMoeBlock

namespace {

const MoeShape& checked(const std::string& prefix, const MoeShape& s, const MoeOptions& o,
                        const ExpertParallel& ep) {
  MT_CHECK(s.moe_experts % ep.size() == 0, "{}: {} experts over ep = {}", prefix, s.moe_experts,
           ep.size());
  MT_CHECK(s.n_embd >= 1 && s.moe_ffn_hidden >= 1 && s.moe_experts >= 1 && s.moe_top_k >= 1 &&
               s.moe_top_k <= s.moe_experts,
           "{}: MoE with C={} F={} E={} top_k={} (need C, F ≥ 1 and 1 ≤ top_k ≤ E)", prefix,
           s.n_embd, s.moe_ffn_hidden, s.moe_experts, s.moe_top_k);
  MT_CHECK(o.moe_capacity_factor >= 0.0 && o.moe_aux_loss_coeff >= 0.0 && o.moe_z_loss_coeff >= 0.0,
           "{}: MoE capacity factor {}, aux coeff {}, z coeff {} (each ≥ 0)", prefix,
           o.moe_capacity_factor, o.moe_aux_loss_coeff, o.moe_z_loss_coeff);
  return s;
}

}  // namespace

SparseMoeBlock::SparseMoeBlock(const std::string& prefix, const MoeShape& shape,
                               const MoeOptions& options, const PlacementTable& records,
                               ExpertParallel ep, MoeTokenGroup tokens, ParameterStorage storage)
    : shape_(checked(prefix, shape, options, ep)),
      options_(options),
      ep_(ep),
      tokens_(tokens),
      gate_(records.at(prefix + ".block_sparse_moe.gate.weight"), 0, 1, InitKind::normal,
            shape.init_std, storage),
      experts_(prefix + ".block_sparse_moe.experts", shape.moe_experts, records, ep.rank(),
               ep.size(), shape.init_std, shape.proj_init_std, storage) {
  MT_CHECK(gate_.shard.logical_shape == Shape({shape.moe_experts, shape.n_embd}) &&
               experts_.parameters().front()->shard.logical_shape ==
                   Shape({shape.moe_ffn_hidden, shape.n_embd}),
           "{}: router {} and expert records do not fit E={} C={} F={}", prefix,
           to_string(gate_.shard.logical_shape), shape.moe_experts, shape.n_embd,
           shape.moe_ffn_hidden);
}

Tensor SparseMoeBlock::run_experts(const Tensor& packed, EpExchange& exchange,
                                   const MicroBatchContext& ctx) {
  const std::vector<std::int64_t>& counts = saved_.at(ctx.slot).dispatch.counts;
  if (ep_.size() == 1) return experts_.forward(packed, counts, ctx);
  exchange = plan_ep_exchange(*ep_.group, counts);
  const Tensor local = ep_dispatch(*ep_.group, exchange, packed);
  return ep_combine(*ep_.group, exchange, experts_.forward(local, exchange.local_counts, ctx));
}

Tensor SparseMoeBlock::experts_backward(const Tensor& d_out, const EpExchange& exchange,
                                        const MicroBatchContext& ctx) {
  if (ep_.size() == 1) return experts_.backward(d_out, ctx);
  const Tensor d_local = ep_dispatch(*ep_.group, exchange, d_out);
  return ep_combine(*ep_.group, exchange, experts_.backward(d_local, ctx));
}

Tensor SparseMoeBlock::forward(const Tensor& x, const SequenceBatch& /*batch*/,
                               const MicroBatchContext& ctx) {
  const std::int64_t C = shape_.n_embd, E = shape_.moe_experts, k = shape_.moe_top_k;
  MT_CHECK(x.ndim() == 2 && x.dim(1) == C && x.dtype() == DType::f32,
           "{}: input {} {} expected [tokens, {}] f32", gate_.name, to_string(x.shape()),
           to_string(x.dtype()), C);
  const std::int64_t N = x.dim(0);
  State& s = saved_.at(ctx.slot);
  s.x = x;
  // 1. Route, in f32 whatever the router weight's dtype (the router is not a matmul autocast
  // rounds: top-k choices are discontinuous in the logits).
  const Tensor wg = value_f32(gate_);
  Tensor logits = Tensor::empty({N, E}, MemCategory::activations);
  kernels::linear_forward(x.f32(), wg.f32(), nullptr, logits.f32(), {N, C, E});
  s.probs = Tensor::empty({N, E}, MemCategory::activations);
  s.lse = Tensor::empty({N}, MemCategory::activations);
  s.top_expert = Tensor::empty({N, k}, MemCategory::activations, DType::i32);
  s.top_weight = Tensor::empty({N, k}, MemCategory::activations);
  kernels::moe_router_forward(logits.f32(), N, E, k, s.probs.f32(), s.lse.f32(), s.top_expert.i32(),
                              s.top_weight.f32());
  last_logits_ = std::move(logits);
  // 2. Dispatch: counts per expert and the packed row order (the exchange point under ep).
  const auto nk = static_cast<std::size_t>(N * k);
  s.dispatch = plan_moe_dispatch({s.top_expert.i32(), nk}, {s.top_weight.f32(), nk}, N, k, E,
                                 moe_expert_capacity(N, k, E, options_.moe_capacity_factor),
                                 options_.moe_token_drop_policy);
  // The losses of the whole micro-batch: under cp / sp its tokens are spread over tokens_'s
  // ranks, whose sums add up (no traffic when both losses are off).
  std::vector<double> sums = moe_router_sums(s.probs.f32(), s.lse.f32(), s.dispatch.routed, N);
  const bool losses_on = options_.moe_aux_loss_coeff != 0.0 || options_.moe_z_loss_coeff != 0.0;
  if (tokens_.group != nullptr && losses_on) tokens_.group->all_reduce_sum(std::span<double>(sums));
  s.losses =
      moe_router_losses_from_sums(sums, k, options_.moe_aux_loss_coeff, options_.moe_z_loss_coeff);
  Tensor packed = Tensor::empty({s.dispatch.rows(), C}, MemCategory::activations);
  kernels::moe_gather_rows(x.f32(), s.dispatch.row_token.data(), packed.f32(), s.dispatch.rows(),
                           C);
  // 3. Experts, 4. combine.
  s.expert_out = run_experts(packed, s.exchange, ctx);
  Tensor y = Tensor::empty({N, C}, MemCategory::activations);
  kernels::moe_combine_forward(s.expert_out.f32(), s.dispatch.assign_row.data(), s.top_weight.f32(),
                               y.f32(), N, k, C);
  stats_ = MoeStats{
      .tokens = N,
      .capacity = s.dispatch.capacity,
      .routed_per_expert = s.dispatch.routed,
      .tokens_per_expert = s.dispatch.counts,
      .dropped = s.dispatch.dropped(),
      .dropped_fraction =
          N == 0 ? 0.0 : static_cast<double>(s.dispatch.dropped()) / static_cast<double>(N * k),
      .losses = s.losses};
  return y;
}

Tensor SparseMoeBlock::backward(const Tensor& dy, const MicroBatchContext& ctx) {
  const std::int64_t C = shape_.n_embd, E = shape_.moe_experts, k = shape_.moe_top_k;
  State s = saved_.take(ctx.slot, gate_.name);
  const std::int64_t N = s.x.dim(0);
  MT_CHECK(dy.ndim() == 2 && dy.dim(0) == N && dy.dim(1) == C, "{}: gradient {} for [{}, {}]",
           gate_.name, to_string(dy.shape()), N, C);
  const MoeDispatch& d = s.dispatch;
  count_step(d, s.losses);
  // Combine: the experts' output gradients and ∂L/∂weight per assignment.
  Tensor d_out = Tensor::empty({d.rows(), C}, MemCategory::activations);
  Tensor d_weight = Tensor::empty({N, k}, MemCategory::activations);
  kernels::moe_combine_backward(dy.f32(), s.expert_out.f32(), d.assign_row.data(),
                                s.top_weight.f32(), d_out.f32(), d_weight.f32(), N, k, C);
  s.expert_out = Tensor();
  // Router: top-k weights + aux + z through the softmax, then the f32 linear (at once: the
  // router is not among the deferred matmuls, like a norm weight's gradient).
  Tensor dlogits = Tensor::empty({N, E}, MemCategory::activations);
  const double loss_grad = loss_grad_scale_ * tokens_.grad_factor;
  std::vector<float> aux_dprob = s.losses.aux_dprob;
  for (float& a : aux_dprob) a = static_cast<float>(a * loss_grad);
  const auto z_scale = static_cast<float>(s.losses.z_scale * loss_grad);
  kernels::moe_router_backward(s.probs.f32(), s.lse.f32(), s.top_expert.i32(), s.top_weight.f32(),
                               d_weight.f32(), aux_dprob.empty() ? nullptr : aux_dprob.data(),
                               z_scale, dlogits.f32(), N, E, k);
  const Tensor wg = value_f32(gate_);
  Tensor dx = Tensor::empty({N, C}, MemCategory::activations);
  kernels::linear_backward(s.x.f32(), wg.f32(), dlogits.f32(), dx.f32(), gate_.grad.f32(), nullptr,
                           {N, C, E});
  // Experts, then the un-permutation of their input gradients onto the tokens.
  const Tensor d_packed = experts_backward(d_out, s.exchange, ctx);
  kernels::moe_scatter_add_rows(d_packed.f32(), d.assign_row.data(), dx.f32(), N, k, C);
  return dx;
}

void SparseMoeBlock::count_step(const MoeDispatch& d, const MoeRouterLosses& losses) {
  MoeStepStats& t = step_stats_;
  const auto E = static_cast<std::size_t>(shape_.moe_experts);
  t.routed_per_expert.resize(E, 0);
  t.tokens_per_expert.resize(E, 0);
  t.micro_batches += 1;
  t.tokens += d.tokens;
  for (std::size_t e = 0; e < E; ++e) {
    t.routed_per_expert[e] += d.routed[e];
    t.tokens_per_expert[e] += d.counts[e];
  }
  t.dropped += d.dropped();
  t.aux_loss += losses.aux_loss;
  t.z_loss += losses.z_loss;
}

MoeStepStats SparseMoeBlock::take_step_stats() {
  MoeStepStats out = std::move(step_stats_);
  step_stats_ = MoeStepStats{};
  out.routed_per_expert.resize(static_cast<std::size_t>(shape_.moe_experts), 0);
  out.tokens_per_expert.resize(static_cast<std::size_t>(shape_.moe_experts), 0);
  return out;
}

ParameterList SparseMoeBlock::parameters() {
  ParameterList out{&gate_};
  for (Parameter* p : experts_.parameters()) out.push_back(p);
  return out;
}

void SparseMoeBlock::discard(const MicroBatchContext& ctx) {
  saved_.release(ctx.slot);
  experts_.discard(ctx);
}

}  // namespace meshtrain
