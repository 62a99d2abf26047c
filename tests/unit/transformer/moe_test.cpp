// SparseMoeBlock (transformer/moe.h) against an independent double-precision re-implementation of
// the same math written here from the papers (Mixtral §2.1 routing, Switch §2.2 capacity and
// load-balancing loss, ST-MoE eq. 5 z-loss): forward output and losses, and every gradient
// (input, router, each expert weight) against central finite differences of the double
// reference — dropless, both capacity policies with real drops, aux + z losses, top_k = E,
// E = 1, and a router that sends every token to one expert. Plus hand values of the losses,
// E = 1 against SwiGluMlp, deferred weight gradients, and bf16 experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "support/placements.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/layers/weight_grad_queue.h"
#include "meshtrain/transformer/mlp.h"
#include "meshtrain/transformer/moe.h"

namespace meshtrain {
namespace {

using Vec = std::vector<double>;

// ---------------------------------------------------------------------------------------------
// The double-precision reference: weights copied out of the layer's Parameters.
struct RefMoe {
  std::int64_t C, E, k, F;
  MoeOptions opt;
  Vec wg;                    // [E, C]
  std::vector<Vec> w1, w3, w2;  // per expert: [F, C], [F, C], [C, F]
};

struct RefOut {
  Vec y;  // [N, C]
  double aux = 0, z = 0;
  std::int64_t dropped = 0;
};

Vec to_vec(const Tensor& t) { return Vec(t.f32(), t.f32() + t.numel()); }

RefMoe ref_of(SparseMoeBlock& layer) {
  const MoeShape& s = layer.shape();
  RefMoe r{s.n_embd, s.moe_experts, s.moe_top_k, s.moe_ffn_hidden, layer.options(), {}, {}, {}, {}};
  const ParameterList ps = layer.parameters();
  r.wg = to_vec(ps[0]->value);
  for (std::int64_t e = 0; e < r.E; ++e) {
    r.w1.push_back(to_vec(ps[1 + 3 * e]->value));
    r.w3.push_back(to_vec(ps[2 + 3 * e]->value));
    r.w2.push_back(to_vec(ps[3 + 3 * e]->value));
  }
  return r;
}

// The pointer of parameter index `i` (layer.parameters() order) inside the reference.
Vec& ref_param(RefMoe& r, std::size_t i) {
  if (i == 0) return r.wg;
  const std::size_t e = (i - 1) / 3;
  const std::size_t which = (i - 1) % 3;
  return which == 0 ? r.w1[e] : which == 1 ? r.w3[e] : r.w2[e];
}

// Capacity: per expert, its (token, slot) assignments in token order; over-full experts keep
// the highest weights (ties: earlier token) or the earliest tokens. Counts the dropped ones.
std::vector<std::vector<bool>> ref_kept(const RefMoe& m,
                                        const std::vector<std::vector<std::int64_t>>& chosen,
                                        const std::vector<Vec>& weight, std::int64_t& dropped) {
  const auto N = static_cast<std::int64_t>(chosen.size());
  const std::int64_t k = m.k, E = m.E;
  std::vector<std::vector<bool>> kept(N, std::vector<bool>(k, true));
  if (m.opt.moe_capacity_factor == 0) return kept;
  const auto cap = static_cast<std::size_t>(std::ceil(
      static_cast<double>(N * k) / static_cast<double>(E) * m.opt.moe_capacity_factor));
  for (std::int64_t e = 0; e < E; ++e) {
    std::vector<std::pair<std::int64_t, std::int64_t>> mine;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t j = 0; j < k; ++j)
        if (chosen[n][j] == e) mine.push_back({n, j});
    if (m.opt.moe_token_drop_policy == MoeDropPolicy::probs) {
      std::stable_sort(mine.begin(), mine.end(), [&](auto a, auto b) {
        return weight[a.first][a.second] > weight[b.first][b.second];
      });
    }
    for (std::size_t i = cap; i < mine.size(); ++i) {
      kept[mine[i].first][mine[i].second] = false;
      ++dropped;
    }
  }
  return kept;
}

RefOut ref_forward(const RefMoe& m, const Vec& x, std::int64_t N) {
  const std::int64_t C = m.C, E = m.E, k = m.k, F = m.F;
  const auto Nd = static_cast<double>(N), Ed = static_cast<double>(E);
  const auto kd = static_cast<double>(k);
  std::vector<std::vector<std::int64_t>> chosen(N);
  std::vector<Vec> weight(N);
  Vec prob_sum(E, 0.0);
  std::vector<std::int64_t> routed(E, 0);
  RefOut out;
  for (std::int64_t n = 0; n < N; ++n) {
    Vec l(E, 0.0);
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t c = 0; c < C; ++c) l[e] += x[n * C + c] * m.wg[e * C + c];
    const double mx = *std::max_element(l.begin(), l.end());
    double s = 0;
    for (double v : l) s += std::exp(v - mx);
    const double lse = mx + std::log(s);
    out.z += lse * lse / Nd;
    std::vector<std::int64_t> order(E);
    for (std::int64_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return l[a] > l[b]; });
    double top = 0;
    for (std::int64_t j = 0; j < k; ++j) top += std::exp(l[order[j]] - lse);
    for (std::int64_t e = 0; e < E; ++e) prob_sum[e] += std::exp(l[e] - lse);
    for (std::int64_t j = 0; j < k; ++j) {
      chosen[n].push_back(order[j]);
      weight[n].push_back(std::exp(l[order[j]] - lse) / top);
      ++routed[order[j]];
    }
  }
  for (std::int64_t e = 0; e < E; ++e) {
    out.aux += m.opt.moe_aux_loss_coeff * Ed * (static_cast<double>(routed[e]) / (Nd * kd)) *
               (prob_sum[e] / Nd);
  }
  out.z *= m.opt.moe_z_loss_coeff;
  const std::vector<std::vector<bool>> kept = ref_kept(m, chosen, weight, out.dropped);
  out.y.assign(N * C, 0.0);
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t j = 0; j < k; ++j) {
      if (!kept[n][j]) continue;
      const std::int64_t e = chosen[n][j];
      Vec act(F);
      for (std::int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (std::int64_t c = 0; c < C; ++c) {
          g += x[n * C + c] * m.w1[e][f * C + c];
          u += x[n * C + c] * m.w3[e][f * C + c];
        }
        act[f] = g / (1 + std::exp(-g)) * u;
      }
      for (std::int64_t c = 0; c < C; ++c) {
        double v = 0;
        for (std::int64_t f = 0; f < F; ++f) v += act[f] * m.w2[e][c * F + f];
        out.y[n * C + c] += weight[n][j] * v;
      }
    }
  }
  return out;
}

// L = Σ y·R + aux + z: what the layer's backward of dy = R (plus its own losses) differentiates.
double ref_loss(const RefMoe& m, const Vec& x, const Vec& R, std::int64_t N) {
  const RefOut o = ref_forward(m, x, N);
  double l = o.aux + o.z;
  for (std::size_t i = 0; i < R.size(); ++i) l += o.y[i] * R[i];
  return l;
}

// max|a − b| / max|b| (a gradient element near zero has no meaningful relative error).
double max_rel(const Vec& a, const Vec& b) {
  double d = 0, s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return s == 0 ? d : d / s;
}

Vec numeric_grad(RefMoe& m, Vec& target, const Vec& x, const Vec& R, std::int64_t N) {
  constexpr double kH = 1e-6;  // double: truncation ~h², rounding ~1e-16/h, both ≪ 1e-8
  Vec g(target.size());
  for (std::size_t i = 0; i < target.size(); ++i) {
    const double keep = target[i];
    target[i] = keep + kH;
    const double up = ref_loss(m, x, R, N);
    target[i] = keep - kH;
    const double down = ref_loss(m, x, R, N);
    target[i] = keep;
    g[i] = (up - down) / (2 * kH);
  }
  return g;
}

Tensor random_tensor(Shape shape, const std::string& name, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), MemCategory::other);
  fill_normal(t.span_f32(), 7, stream_of(name), 0, 0.0f, scale);
  return t;
}

// The records of a layer of `shape` under `prefix` on one rank.
PlacementTable records_of(const std::string& prefix, const MoeShape& shape) {
  return test::records_table(
      {test::moe_records(prefix, shape.moe_experts, shape.n_embd, shape.moe_ffn_hidden)});
}

SparseMoeBlock make_layer(const MoeShape& shape, const MoeOptions& options) {
  SparseMoeBlock layer("model.layers.0", shape, options, records_of("model.layers.0", shape));
  for (Parameter* p : layer.parameters()) initialize(*p, /*seed=*/11);
  return layer;
}

// Router std 0.5 over C = 8 gives logits of std ≈ 1.4: decisive routings, so no top-k or
// capacity choice sits within the finite-difference step of a tie.
MoeShape small_shape(std::int64_t E, std::int64_t k) {
  return {.n_embd = 8, .moe_experts = E, .moe_top_k = k, .moe_ffn_hidden = 12,
          .init_std = 0.5f, .proj_init_std = 0.3f};
}

struct Case {
  std::string name;
  MoeShape shape;
  MoeOptions options;
  bool expect_drops = false;
};

// f32 layer against the double reference: forward to 1e-5 of the largest output element,
// gradients to 1e-4 of the largest gradient element (f32 sums of ≤ 12 products, ~1e-7
// expected; a missing term or a wrong factor is ≥ 1e-2).
void check_case(const Case& c, std::int64_t N = 12) {
  SCOPED_TRACE(c.name);
  SparseMoeBlock layer = make_layer(c.shape, c.options);
  const Tensor x = random_tensor({N, c.shape.n_embd}, "moe.x");
  const Tensor R = random_tensor({N, c.shape.n_embd}, "moe.R");
  const Tensor y = layer.forward(x, {1, N}, {});
  RefMoe ref = ref_of(layer);
  const Vec xv = to_vec(x), Rv = to_vec(R);
  const RefOut expected = ref_forward(ref, xv, N);
  EXPECT_LT(max_rel(to_vec(y), expected.y), 1e-5);
  EXPECT_NEAR(layer.stats().losses.aux_loss, expected.aux, 1e-6 * std::max(1.0, expected.aux));
  EXPECT_NEAR(layer.stats().losses.z_loss, expected.z, 1e-6 * std::max(1.0, expected.z));
  EXPECT_EQ(layer.stats().dropped, expected.dropped);
  if (c.expect_drops) {
    EXPECT_GT(expected.dropped, 0);
  }
  const Tensor dx = layer.backward(R, {});
  Vec x_copy = xv;
  EXPECT_LT(max_rel(to_vec(dx), numeric_grad(ref, x_copy, x_copy, Rv, N)), 1e-4) << "dx";
  const ParameterList ps = layer.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const Vec fd = numeric_grad(ref, ref_param(ref, i), xv, Rv, N);
    EXPECT_LT(max_rel(to_vec(ps[i]->grad), fd), 1e-4) << ps[i]->name;
  }
}

TEST(MoeLayer, ForwardAndEveryGradientMatchDoubleReference) {
  const MoeOptions dropless{};
  const MoeOptions losses{.moe_aux_loss_coeff = 0.1, .moe_z_loss_coeff = 0.01};
  const MoeOptions probs{.moe_capacity_factor = 1.0, .moe_token_drop_policy = MoeDropPolicy::probs};
  const MoeOptions position{.moe_capacity_factor = 1.0,
                            .moe_token_drop_policy = MoeDropPolicy::position};
  const MoeOptions all{.moe_capacity_factor = 0.75,
                       .moe_token_drop_policy = MoeDropPolicy::probs,
                       .moe_aux_loss_coeff = 0.05,
                       .moe_z_loss_coeff = 0.02};
  for (const Case& c : {Case{"dropless top-2 of 4", small_shape(4, 2), dropless},
                        Case{"aux + z losses", small_shape(4, 2), losses},
                        Case{"capacity 1.0, probs", small_shape(4, 2), probs, true},
                        Case{"capacity 1.0, position", small_shape(4, 2), position, true},
                        Case{"capacity 0.75 + losses", small_shape(4, 2), all, true},
                        Case{"top-1 of 4 + losses", small_shape(4, 1), all, true},
                        Case{"top_k = E = 3", small_shape(3, 3), losses},
                        Case{"E = 1", small_shape(1, 1), losses}}) {
    check_case(c);
  }
}

// Every token picks expert 0 (a large router weight on a feature that is positive for every
// token): dropless computes them all on expert 0; with capacity the later tokens (position) are
// dropped and give zero rows; both backwards are exact.
TEST(MoeLayer, EveryTokenToOneExpert) {
  constexpr std::int64_t N = 12;
  for (const MoeOptions& o : {MoeOptions{}, MoeOptions{.moe_capacity_factor = 1.0,
                                            .moe_token_drop_policy = MoeDropPolicy::position}}) {
    SparseMoeBlock layer = make_layer(small_shape(4, 1), o);
    Tensor& wg = layer.parameters()[0]->value;
    wg.zero();
    wg.f32()[0] = 20.0f;  // expert 0 reads feature 0
    Tensor x = random_tensor({N, 8}, "moe.x");
    for (std::int64_t n = 0; n < N; ++n) x.f32()[n * 8] = 1.0f + 0.1f * static_cast<float>(n);
    const Tensor y = layer.forward(x, {1, N}, {});
    const MoeStats& s = layer.stats();
    EXPECT_EQ(s.routed_per_expert, (std::vector<std::int64_t>{N, 0, 0, 0}));
    const std::int64_t kept = o.moe_capacity_factor > 0 ? 3 : N;  // ⌈12·1/4⌉ = 3
    EXPECT_EQ(s.tokens_per_expert, (std::vector<std::int64_t>{kept, 0, 0, 0}));
    EXPECT_DOUBLE_EQ(s.dropped_fraction, static_cast<double>(N - kept) / N);
    for (std::int64_t i = kept * 8; i < N * 8; ++i) EXPECT_EQ(y.f32()[i], 0.0f);
    const RefOut ref = ref_forward(ref_of(layer), to_vec(x), N);
    EXPECT_LT(max_rel(to_vec(y), ref.y), 1e-5);
    layer.backward(random_tensor({N, 8}, "moe.R"), {});
    for (std::size_t i = 4; i < 13; ++i) {  // experts 1–3 saw no token
      EXPECT_EQ(kernels::sum_squares(layer.parameters()[i]->grad.f32(), 96), 0.0);
    }
  }
}

// A zero router makes probs uniform (1/E) and lse = log E: load balance E·Σ fᵢ/E = 1, z-loss
// (log E)². With zero experts the output is 0, so the router's gradient is the losses' alone:
// dlogits[n, i] = pᵢ(aᵢ − Σ pⱼaⱼ) + (2c_z/N)·log E·pᵢ with aᵢ = c·E·fᵢ/N; top-2 ties pick
// experts 0 and 1 for every token, f = (½, ½, 0, 0), so dlogits = (±c/4 + c_z·log 4 / 2)/N.
TEST(MoeLayer, AuxAndZLossHandValuesAndGradients) {
  constexpr std::int64_t N = 6;
  constexpr double c = 0.1, cz = 0.01;
  SparseMoeBlock layer =
      make_layer(small_shape(4, 2), {.moe_aux_loss_coeff = c, .moe_z_loss_coeff = cz});
  for (Parameter* p : layer.parameters()) p->value.zero();
  layer.set_loss_grad_scale(2.0);  // multiplies only the gradients
  const Tensor x = random_tensor({N, 8}, "moe.x");
  layer.forward(x, {1, N}, {});
  const MoeRouterLosses& l = layer.stats().losses;
  EXPECT_NEAR(l.load_balance, 1.0, 1e-7);
  EXPECT_NEAR(l.aux_loss, c, 1e-8);
  EXPECT_NEAR(l.z_loss, cz * std::log(4.0) * std::log(4.0), 1e-7);
  layer.backward(random_tensor({N, 8}, "moe.R"), {});
  const Tensor& g = layer.parameters()[0]->grad;  // [E, C] = dlogitsᵀ·x
  for (std::int64_t i = 0; i < 4; ++i) {
    const double aux = (i < 2 ? c / 4 : -c / 4) / N;
    const double dl = 2.0 * (aux + cz * std::log(4.0) / 2 / N);
    for (std::int64_t col = 0; col < 8; ++col) {
      double xs = 0;
      for (std::int64_t n = 0; n < N; ++n) xs += x.f32()[n * 8 + col];
      EXPECT_NEAR(g.f32()[i * 8 + col], dl * xs, 1e-6) << i << "," << col;
    }
  }
}

// E = 1, top-1: the weight is 1 for every token, so the block is exactly a SwiGluMlp with
// gate_proj = w1, up_proj = w3, down_proj = w2; the router gets no gradient.
TEST(MoeLayer, SingleExpertIsTheSwiGluMlp) {
  constexpr std::int64_t N = 10;
  SparseMoeBlock moe = make_layer(small_shape(1, 1), {});
  const auto one = single_rank_group("tp");
  SwiGluMlp mlp("m", {.init_std = 0.1f, .proj_init_std = 0.1f},
                test::records_table({test::mlp_records("m", 8, 12, false, true)}),
                TensorParallel{*one});
  const ParameterList mp = mlp.parameters(), ep = moe.parameters();  // gate, up, down / wg, w1, w3, w2
  for (int i = 0; i < 3; ++i) mp[static_cast<std::size_t>(i)]->value.copy_from(ep[1 + i]->value);
  const Tensor x = random_tensor({N, 8}, "moe.x"), R = random_tensor({N, 8}, "moe.R");
  EXPECT_LT(max_rel(to_vec(moe.forward(x, {1, N}, {})), to_vec(mlp.forward(x, {1, N}, {}))), 1e-6);
  EXPECT_LT(max_rel(to_vec(moe.backward(R, {})), to_vec(mlp.backward(R, {}))), 1e-6);
  for (int i = 0; i < 3; ++i) {
    EXPECT_LT(max_rel(to_vec(ep[1 + i]->grad), to_vec(mp[static_cast<std::size_t>(i)]->grad)),
              1e-6);
  }
  EXPECT_EQ(kernels::sum_squares(ep[0]->grad.f32(), 8), 0.0);
}

// Zero-bubble schedules: with a queue in the context the experts' weight gradients are queued and
// WeightGradQueue::run gives bitwise the fused gradients (the same GEMMs, later); two
// micro-batches in different activation slots keep their own state.
TEST(MoeLayer, DeferredWeightGradsAndSlotsMatchFused) {
  constexpr std::int64_t N = 12;
  const MoeOptions o{.moe_capacity_factor = 1.0, .moe_aux_loss_coeff = 0.1};
  SparseMoeBlock fused = make_layer(small_shape(4, 2), o), deferred = make_layer(small_shape(4, 2), o);
  const Tensor x0 = random_tensor({N, 8}, "moe.x"), x1 = random_tensor({N, 8}, "moe.x1");
  const Tensor r0 = random_tensor({N, 8}, "moe.R"), r1 = random_tensor({N, 8}, "moe.R1");
  fused.forward(x0, {1, N}, {});
  const Tensor dx0 = fused.backward(r0, {});
  fused.forward(x1, {1, N}, {});
  const Tensor dx1 = fused.backward(r1, {});
  WeightGradQueue queue;
  Tensor dd0, dd1;
  {
    const MicroBatchContext slot0{.slot = 0, .defer_weight_grads = &queue};
    const MicroBatchContext slot1{.slot = 1, .defer_weight_grads = &queue};
    deferred.forward(x0, {1, N}, slot0);
    deferred.forward(x1, {1, N}, slot1);
    dd0 = deferred.backward(r0, slot0);
    dd1 = deferred.backward(r1, slot1);
  }
  EXPECT_GT(queue.pending(), 0U);
  queue.run(0);
  queue.run(1);
  EXPECT_EQ(to_vec(dd0), to_vec(dx0));
  EXPECT_EQ(to_vec(dd1), to_vec(dx1));
  const ParameterList a = fused.parameters(), b = deferred.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(to_vec(a[i]->grad), to_vec(b[i]->grad)) << a[i]->name;
}

// Mixed precision, lightly: bf16 expert and router weights (the router widened to f32, the
// experts' GEMMs in bf16 with f32 accumulation) against the f32 layer holding the same
// bf16-rounded values. The routing is identical (f32 router on the same values); the outputs
// differ by the bf16 rounding of the activations (≈ 2⁻⁹ relative per product).
TEST(MoeLayer, Bf16WeightsFollowTheAutocastRule) {
  constexpr std::int64_t N = 12;
  SparseMoeBlock f32 = make_layer(small_shape(4, 2), {}), bf16 = make_layer(small_shape(4, 2), {});
  const ParameterList a = f32.parameters(), b = bf16.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    b[i]->value = b[i]->value.to(DType::bf16, MemCategory::params);
    a[i]->value = b[i]->value.to(DType::f32, MemCategory::params);
  }
  const Tensor x = random_tensor({N, 8}, "moe.x"), R = random_tensor({N, 8}, "moe.R");
  EXPECT_LT(max_rel(to_vec(bf16.forward(x, {1, N}, {})), to_vec(f32.forward(x, {1, N}, {}))), 2e-2);
  EXPECT_EQ(bf16.stats().tokens_per_expert, f32.stats().tokens_per_expert);
  EXPECT_EQ(to_vec(bf16.last_logits()), to_vec(f32.last_logits()));  // the router is f32
  EXPECT_LT(max_rel(to_vec(bf16.backward(R, {})), to_vec(f32.backward(R, {}))), 3e-2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]->grad.dtype(), DType::f32);
    EXPECT_LT(max_rel(to_vec(b[i]->grad), to_vec(a[i]->grad)), 3e-2) << a[i]->name;
  }
}

TEST(MoeLayerDeathTest, RejectsBadShapes) {
  // Rejected before any record is read: the layer's checks come first.
  const PlacementTable none = test::records_table({});
  EXPECT_DEATH(SparseMoeBlock("l", small_shape(2, 3), {}, none), "E=2 top_k=3");
  EXPECT_DEATH(SparseMoeBlock("l", small_shape(0, 1), {}, none), "E=0 top_k=1");
  EXPECT_DEATH(SparseMoeBlock("l", small_shape(2, 1), {.moe_capacity_factor = -1.0}, none),
               "capacity factor -1");
}

TEST(MoeLayer, HuggingFaceMixtralNames) {
  SparseMoeBlock layer("model.layers.3", small_shape(2, 1), {},
                       records_of("model.layers.3", small_shape(2, 1)));
  std::vector<std::string> names;
  for (const Parameter* p : layer.parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "model.layers.3.block_sparse_moe.gate.weight",
                       "model.layers.3.block_sparse_moe.experts.0.w1.weight",
                       "model.layers.3.block_sparse_moe.experts.0.w3.weight",
                       "model.layers.3.block_sparse_moe.experts.0.w2.weight",
                       "model.layers.3.block_sparse_moe.experts.1.w1.weight",
                       "model.layers.3.block_sparse_moe.experts.1.w3.weight",
                       "model.layers.3.block_sparse_moe.experts.1.w2.weight"}));
  EXPECT_EQ(layer.parameters()[0]->value.shape(), (Shape{2, 8}));
  EXPECT_EQ(layer.parameters()[3]->value.shape(), (Shape{8, 12}));
}

}  // namespace
}  // namespace meshtrain
