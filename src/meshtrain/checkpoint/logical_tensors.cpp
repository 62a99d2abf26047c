#include "meshtrain/checkpoint/logical_tensors.h"

#include "meshtrain/parallel/tp/gather.h"

namespace meshtrain {
namespace {

// `mine` of group rank `root`, on every rank of `group`: its count, then per tensor the name,
// shape and values (the root returns its own). Collective over `group`.
std::vector<NamedTensor> broadcast_named(ProcessGroup& group, int root,
                                         std::span<const NamedTensor> mine) {
  const bool own = root == group.rank();
  std::int64_t count = static_cast<std::int64_t>(mine.size());
  group.broadcast(std::as_writable_bytes(std::span<std::int64_t>(&count, 1)), root);
  std::vector<NamedTensor> out;
  for (std::int64_t i = 0; i < count; ++i) {
    const NamedTensor* m = own ? &mine[static_cast<std::size_t>(i)] : nullptr;
    std::string name = own ? m->name : std::string();
    Shape shape = own ? m->tensor.shape() : Shape{};
    std::int64_t header[2] = {static_cast<std::int64_t>(name.size()),
                              static_cast<std::int64_t>(shape.size())};
    group.broadcast(std::as_writable_bytes(std::span<std::int64_t>(header)), root);
    name.resize(static_cast<std::size_t>(header[0]));
    shape.resize(static_cast<std::size_t>(header[1]));
    group.broadcast(std::as_writable_bytes(std::span<char>(name)), root);
    group.broadcast(std::as_writable_bytes(std::span<std::int64_t>(shape)), root);
    Tensor value = own ? m->tensor : Tensor::empty(shape, MemCategory::other);
    group.broadcast(std::as_writable_bytes(value.span_f32()), root);
    out.push_back({std::move(name), std::move(value)});
  }
  return out;
}

// `mine` (this ep rank's logical tensors; expert[i]: tensor i is an expert weight) with every
// ep rank's experts in place of its own. Every ep rank holds the same stage, so the expert
// tensors sit at the same positions on each; a run of them (one MoE block's L = E/ep experts)
// is replaced by ep rank 0's run, then rank 1's, …: experts 0 … E−1 in order. Collective over
// ep: every ep rank broadcasts each of its runs in turn.
std::vector<NamedTensor> with_every_expert(ProcessGroup& ep, std::vector<NamedTensor> mine,
                                           const std::vector<bool>& expert) {
  std::vector<NamedTensor> out;
  for (std::size_t i = 0; i < mine.size();) {
    if (!expert[i]) {
      out.push_back(std::move(mine[i++]));
      continue;
    }
    std::size_t end = i;
    while (end < mine.size() && expert[end]) ++end;
    const std::span<const NamedTensor> run(mine.data() + i, end - i);
    for (int root = 0; root < ep.size(); ++root) {
      for (NamedTensor& t : broadcast_named(ep, root, run)) out.push_back(std::move(t));
    }
    i = end;
  }
  return out;
}

}  // namespace

std::vector<NamedTensor> gather_logical_tensors(
    const ParameterList& params, const std::function<Tensor(const Parameter&)>& master,
    const DeviceMesh& mesh) {
  // 1. Each rank's parameters, its ZeRO slices gathered over their replica group and its tp
  //    shards over tp (collectives every rank takes part in).
  // 2. ep > 1: every ep rank broadcasts its experts over ep in turn, so each holds all E.
  // 3. pp > 1: every stage in turn broadcasts its tensors over pp, so the first holds all.
  // dp (and edp) replicas are identical; every rank ends with the whole model.
  ProcessGroup& tp = mesh.group(Axis::tp);
  ProcessGroup& ep = mesh.group(Axis::ep);
  ProcessGroup& pp = mesh.group(Axis::pp);
  std::vector<NamedTensor> mine;
  std::vector<bool> expert;
  for (const Parameter* p : params) {
    if (p->placement.tied_copy) continue;
    mine.push_back({p->name, gather_logical(*p, master(*p), tp)});
    expert.push_back(p->placement.replicas == ReplicaGroup::expert);
  }
  if (ep.size() > 1) mine = with_every_expert(ep, std::move(mine), expert);
  if (pp.size() == 1) return mine;
  std::vector<NamedTensor> all;
  for (int root = 0; root < pp.size(); ++root) {
    for (NamedTensor& t : broadcast_named(pp, root, mine)) all.push_back(std::move(t));
  }
  return all;
}

}  // namespace meshtrain
