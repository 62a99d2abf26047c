#include "meshtrain/transformer/moe_routing.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/core/error.h"

namespace meshtrain {

std::optional<std::int64_t> moe_expert_capacity(std::int64_t tokens, std::int64_t top_k,
                                                std::int64_t experts, double capacity_factor) {
  MT_CHECK(tokens >= 0 && top_k >= 1 && experts >= 1 && capacity_factor >= 0.0,
           "moe capacity of tokens={} top_k={} experts={} capacity_factor={}", tokens, top_k,
           experts, capacity_factor);
  if (capacity_factor == 0.0) return std::nullopt;
  const double per_expert = static_cast<double>(tokens * top_k) / static_cast<double>(experts);
  return static_cast<std::int64_t>(std::ceil(per_expert * capacity_factor));
}

namespace {

// The assignments of one expert that survive its capacity, in token order. `mine` lists the
// expert's assignments in token order (a stable bucket of the routing).
std::vector<std::int64_t> kept_assignments(std::vector<std::int64_t> mine,
                                           std::optional<std::int64_t> capacity,
                                           MoeDropPolicy policy,
                                           std::span<const float> top_weight) {
  if (!capacity || static_cast<std::int64_t>(mine.size()) <= *capacity) return mine;
  const auto cap = static_cast<std::size_t>(*capacity);
  if (policy == MoeDropPolicy::probs) {
    // Highest weight first; stable, so equal weights keep token order (earlier token wins).
    std::stable_sort(mine.begin(), mine.end(), [&](std::int64_t a, std::int64_t b) {
      return top_weight[static_cast<std::size_t>(a)] > top_weight[static_cast<std::size_t>(b)];
    });
  }
  mine.resize(cap);
  std::sort(mine.begin(), mine.end());  // back to token order (a = n·k + j grows with n)
  return mine;
}

}  // namespace

MoeDispatch plan_moe_dispatch(std::span<const std::int32_t> top_expert,
                              std::span<const float> top_weight, std::int64_t tokens,
                              std::int64_t top_k, std::int64_t experts,
                              std::optional<std::int64_t> capacity, MoeDropPolicy policy) {
  const auto assignments = static_cast<std::size_t>(tokens * top_k);
  MT_CHECK(tokens >= 0 && top_k >= 1 && experts >= 1 && top_k <= experts &&
               top_expert.size() == assignments && top_weight.size() == assignments,
           "moe dispatch: {} experts and {} weights for tokens={} top_k={} experts={}",
           top_expert.size(), top_weight.size(), tokens, top_k, experts);
  MT_CHECK(!capacity || *capacity >= 0, "moe dispatch: capacity {}", capacity.value_or(0));
  MoeDispatch d;
  d.tokens = tokens;
  d.top_k = top_k;
  d.experts = experts;
  d.capacity = capacity;
  const auto E = static_cast<std::size_t>(experts);
  std::vector<std::vector<std::int64_t>> by_expert(E);
  for (std::size_t a = 0; a < assignments; ++a) {
    const std::int32_t e = top_expert[a];
    MT_CHECK(e >= 0 && e < experts, "moe dispatch: assignment {} names expert {} of {}", a, e,
             experts);
    by_expert[static_cast<std::size_t>(e)].push_back(static_cast<std::int64_t>(a));
  }
  d.routed.resize(E);
  d.counts.resize(E);
  d.offsets.assign(E + 1, 0);
  d.assign_row.assign(assignments, -1);
  for (std::size_t e = 0; e < E; ++e) {
    d.routed[e] = static_cast<std::int64_t>(by_expert[e].size());
    const std::vector<std::int64_t> kept =
        kept_assignments(std::move(by_expert[e]), capacity, policy, top_weight);
    d.counts[e] = static_cast<std::int64_t>(kept.size());
    d.offsets[e + 1] = d.offsets[e] + d.counts[e];
    for (const std::int64_t a : kept) {
      d.assign_row[static_cast<std::size_t>(a)] = static_cast<std::int32_t>(d.row_token.size());
      d.row_token.push_back(static_cast<std::int32_t>(a / top_k));
    }
  }
  return d;
}

std::vector<double> moe_router_sums(const float* probs, const float* lse,
                                    std::span<const std::int64_t> routed, std::int64_t tokens) {
  const auto E = static_cast<std::int64_t>(routed.size());
  MT_CHECK(E >= 1 && tokens >= 0, "moe router sums: E={} tokens={}", E, tokens);
  std::vector<double> sums(static_cast<std::size_t>(2 * E + 2), 0.0);
  for (std::int64_t e = 0; e < E; ++e) {
    sums[static_cast<std::size_t>(e)] = static_cast<double>(routed[static_cast<std::size_t>(e)]);
  }
  for (std::int64_t n = 0; n < tokens; ++n) {
    for (std::int64_t e = 0; e < E; ++e) sums[static_cast<std::size_t>(E + e)] += probs[n * E + e];
    sums[static_cast<std::size_t>(2 * E)] += static_cast<double>(lse[n]) * lse[n];
  }
  sums[static_cast<std::size_t>(2 * E + 1)] = static_cast<double>(tokens);
  return sums;
}

MoeRouterLosses moe_router_losses_from_sums(std::span<const double> sums, std::int64_t top_k,
                                            double aux_loss_coeff, double z_loss_coeff) {
  const auto E = static_cast<std::int64_t>((sums.size() - 2) / 2);
  MT_CHECK(sums.size() >= 4 && sums.size() % 2 == 0 && top_k >= 1,
           "moe router losses: {} sums, top_k={}", sums.size(), top_k);
  MoeRouterLosses out;
  const double N = sums[static_cast<std::size_t>(2 * E + 1)];
  if (N == 0.0) return out;
  const double assignments = N * static_cast<double>(top_k);
  double balance = 0.0;
  for (std::int64_t e = 0; e < E; ++e) {
    balance += (sums[static_cast<std::size_t>(e)] / assignments) *
               (sums[static_cast<std::size_t>(E + e)] / N);
  }
  out.load_balance = static_cast<double>(E) * balance;
  out.aux_loss = aux_loss_coeff * out.load_balance;
  out.router_z = sums[static_cast<std::size_t>(2 * E)] / N;
  out.z_loss = z_loss_coeff * out.router_z;
  if (aux_loss_coeff != 0.0) {
    out.aux_dprob.resize(static_cast<std::size_t>(E));
    for (std::int64_t e = 0; e < E; ++e) {
      const double f = sums[static_cast<std::size_t>(e)] / assignments;
      out.aux_dprob[static_cast<std::size_t>(e)] =
          static_cast<float>(aux_loss_coeff * static_cast<double>(E) * f / N);
    }
  }
  out.z_scale = static_cast<float>(2.0 * z_loss_coeff / N);
  return out;
}

MoeRouterLosses moe_router_losses(const float* probs, const float* lse,
                                  std::span<const std::int64_t> routed, std::int64_t tokens,
                                  std::int64_t top_k, double aux_loss_coeff, double z_loss_coeff) {
  MT_CHECK(!routed.empty() && top_k >= 1 && tokens >= 0,
           "moe router losses: E={} top_k={} tokens={}", routed.size(), top_k, tokens);
  return moe_router_losses_from_sums(moe_router_sums(probs, lse, routed, tokens), top_k,
                                     aux_loss_coeff, z_loss_coeff);
}

}  // namespace meshtrain
