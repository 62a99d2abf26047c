#include "meshtrain/parallel/ep/expert_parallel.h"

#include <cstring>
#include <limits>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

std::vector<std::int64_t> scaled(const std::vector<std::int64_t>& counts, std::int64_t by) {
  std::vector<std::int64_t> out(counts);
  for (std::int64_t& c : out) c *= by;
  return out;
}

void copy_row(const float* src, std::int64_t from, float* dst, std::int64_t to, std::int64_t c) {
  std::memcpy(dst + to * c, src + from * c, static_cast<std::size_t>(c) * sizeof(float));
}

}  // namespace

EpExchange plan_ep_exchange(ProcessGroup& ep, std::span<const std::int64_t> counts) {
  const int n = ep.size();
  const auto E = static_cast<std::int64_t>(counts.size());
  MT_CHECK(E % n == 0, "expert parallel over {}: {} experts do not divide by {} ranks", ep.name(),
           E, n);
  EpExchange plan{.ep = n,
                  .local_experts = E / n,
                  .send_counts = std::vector<std::int64_t>(static_cast<std::size_t>(n), 0),
                  .recv_counts = std::vector<std::int64_t>(static_cast<std::size_t>(n), 0),
                  .local_counts = std::vector<std::int64_t>(static_cast<std::size_t>(E / n), 0),
                  .to_expert_major = {}};
  const std::int64_t L = plan.local_experts;
  // The counts travel as int32: 4 bytes each, and MPI's own element counts are ints.
  std::vector<std::int32_t> mine(static_cast<std::size_t>(E)), theirs(static_cast<std::size_t>(E));
  for (std::int64_t e = 0; e < E; ++e) {
    MT_CHECK(counts[e] >= 0 && counts[e] <= std::numeric_limits<std::int32_t>::max(),
             "expert {}: {} rows", e, counts[e]);
    mine[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(counts[e]);
    plan.send_counts[static_cast<std::size_t>(e / L)] += counts[e];
  }
  // theirs[s·L + l]: rows source s sends to local expert l.
  ep.all_to_all(std::span<const std::int32_t>(mine), std::span<std::int32_t>(theirs));
  std::vector<std::int64_t> from(static_cast<std::size_t>(E));
  for (std::int64_t i = 0; i < E; ++i) {
    from[static_cast<std::size_t>(i)] = theirs[static_cast<std::size_t>(i)];
    plan.recv_counts[static_cast<std::size_t>(i / L)] += from[static_cast<std::size_t>(i)];
    plan.local_counts[static_cast<std::size_t>(i % L)] += from[static_cast<std::size_t>(i)];
  }
  // Expert-major: local expert l's block starts after experts < l; within it, source s's rows
  // follow those of sources < s.
  std::vector<std::int64_t> next(static_cast<std::size_t>(L), 0);
  for (std::int64_t l = 1; l < L; ++l) {
    next[static_cast<std::size_t>(l)] =
        next[static_cast<std::size_t>(l - 1)] + plan.local_counts[static_cast<std::size_t>(l - 1)];
  }
  for (int s = 0; s < n; ++s) {
    for (std::int64_t l = 0; l < L; ++l) {
      for (std::int64_t r = 0; r < from[static_cast<std::size_t>(s * L + l)]; ++r) {
        plan.to_expert_major.push_back(next[static_cast<std::size_t>(l)]++);
      }
    }
  }
  return plan;
}

Tensor ep_dispatch(ProcessGroup& ep, const EpExchange& plan, const Tensor& rows) {
  const std::int64_t C = rows.dim(1), received = plan.rows_received();
  Tensor arrived = Tensor::empty({received, C}, MemCategory::comm);
  ep.all_to_allv(rows.span_f32(), scaled(plan.send_counts, C), arrived.span_f32(),
                 scaled(plan.recv_counts, C));
  Tensor out = Tensor::empty({received, C}, MemCategory::activations);
  for (std::int64_t r = 0; r < received; ++r) {
    copy_row(arrived.f32(), r, out.f32(), plan.to_expert_major[static_cast<std::size_t>(r)], C);
  }
  return out;
}

Tensor ep_combine(ProcessGroup& ep, const EpExchange& plan, const Tensor& rows) {
  const std::int64_t C = rows.dim(1), received = plan.rows_received();
  MT_CHECK(rows.dim(0) == received, "ep_combine over {}: {} rows for {} received", ep.name(),
           rows.dim(0), received);
  Tensor leaving = Tensor::empty({received, C}, MemCategory::comm);
  for (std::int64_t r = 0; r < received; ++r) {
    copy_row(rows.f32(), plan.to_expert_major[static_cast<std::size_t>(r)], leaving.f32(), r, C);
  }
  std::int64_t sent = 0;
  for (const std::int64_t c : plan.send_counts) sent += c;
  Tensor out = Tensor::empty({sent, C}, MemCategory::activations);
  ep.all_to_allv(leaving.span_f32(), scaled(plan.recv_counts, C), out.span_f32(),
                 scaled(plan.send_counts, C));
  return out;
}

}  // namespace meshtrain
