#include "meshtrain/parallel/dp/zero_groups.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain {
namespace {

ParameterList in_group(const ParameterList& params, ReplicaGroup g) {
  ParameterList out;
  std::copy_if(params.begin(), params.end(), std::back_inserter(out),
               [g](const Parameter* p) { return p->placement.replicas == g; });
  return out;
}

}  // namespace

ZeroGroups::ZeroGroups(const ParameterList& params, const std::vector<ParameterList>& units,
                       const std::function<ZeroGroup(ReplicaGroup)>& group_of,
                       const ZeroOptions& options)
    : stage_(options.stage) {
  for (const ReplicaGroup g : {ReplicaGroup::dense, ReplicaGroup::expert}) {
    const ParameterList mine = in_group(params, g);
    if (mine.empty()) continue;
    std::vector<ParameterList> unit_parts;
    for (const ParameterList& unit : units) {
      ParameterList part = in_group(unit, g);
      if (!part.empty()) unit_parts.push_back(std::move(part));
    }
    const ZeroGroup where = group_of(g);
    MT_CHECK(where.mean_over >= where.ranks.size(), "{} group {}: mean over {} ranks", to_string(g),
             where.ranks.name(), where.mean_over);
    groups_.push_back(
        {g, std::make_unique<ZeroSharding>(mine, std::move(unit_parts), where.ranks, options),
         static_cast<float>(where.ranks.size()) / static_cast<float>(where.mean_over)});
    for (const OptimizerShard& s : groups_.back().zero->shards()) shards_.push_back(s);
  }
}

const ParameterList* ZeroGroups::part(const ParameterList* unit, std::size_t i) {
  if (unit == nullptr) return nullptr;
  auto [it, added] = parts_.try_emplace({unit, i});
  if (added) it->second = in_group(*unit, groups_[i].kind);
  return it->second.empty() ? nullptr : &it->second;
}

ZeroSharding& ZeroGroups::of(const Parameter& p) {
  for (Group& g : groups_) {
    if (g.kind == p.placement.replicas) return *g.zero;
  }
  MT_CHECK(false, "{}: its replica group ({}) has no ZeRO state", p.name, to_string(p.placement.replicas));
  return *groups_.front().zero;  // not reached: MT_CHECK aborts
}

void ZeroGroups::reduce_gradients() {
  for (Group& g : groups_) {
    g.zero->reduce_gradients();
    if (g.rescale == 1.0f) continue;
    for (OptimizerShard& s : g.zero->shards()) {
      kernels::scale_inplace(s.grad.f32(), g.rescale, s.grad.numel());
    }
  }
}

void ZeroGroups::publish_parameters() {
  for (Group& g : groups_) g.zero->publish_parameters();
}

void ZeroGroups::zero_grad(bool shards_zeroed) {
  for (Group& g : groups_) g.zero->zero_grad(shards_zeroed);
}

std::size_t ZeroGroups::buckets_posted_in_backward() const noexcept {
  std::size_t n = 0;
  for (const Group& g : groups_) n += g.zero->buckets_posted_in_backward();
  return n;
}

double ZeroGroups::reduce_seconds_in_backward() const noexcept {
  double s = 0.0;
  for (const Group& g : groups_) s += g.zero->reduce_seconds_in_backward();
  return s;
}

Tensor ZeroGroups::gather_master(const Parameter& p) { return of(p).gather_master(p); }
Tensor ZeroGroups::gather_grad(const Parameter& p) { return of(p).gather_grad(p); }

// A group sees only the units that hold some of its parameters, and as `next` the next unit
// that the model names if it holds some (else no prefetch: a gather on demand).
template <typename Call>
void ZeroGroups::each_part(const ParameterList& unit, Call&& call) {
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    if (const ParameterList* u = part(&unit, i)) call(*groups_[i].zero, *u, i);
  }
}

void ZeroGroups::before_forward(const ParameterList& unit, const ParameterList* next) {
  each_part(unit, [&](ZeroSharding& z, const ParameterList& u, std::size_t i) {
    z.before_forward(u, part(next, i));
  });
}

void ZeroGroups::after_forward(const ParameterList& unit) {
  each_part(unit, [](ZeroSharding& z, const ParameterList& u, std::size_t) { z.after_forward(u); });
}

void ZeroGroups::before_backward(const ParameterList& unit, const ParameterList* next) {
  each_part(unit, [&](ZeroSharding& z, const ParameterList& u, std::size_t i) {
    z.before_backward(u, part(next, i));
  });
}

void ZeroGroups::after_backward(const ParameterList& unit) {
  each_part(unit,
            [](ZeroSharding& z, const ParameterList& u, std::size_t) { z.after_backward(u); });
}

}  // namespace meshtrain
