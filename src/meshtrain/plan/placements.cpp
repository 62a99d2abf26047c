#include "meshtrain/plan/placements.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace meshtrain::plan {
namespace {

std::string shape_text(const Shape& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "×" : "") + fmt::format("{}", s[i]);
  return out;
}

std::string axes_text(const std::vector<Axis>& axes) {
  std::string out;
  for (const Axis a : axes) out += (out.empty() ? "" : ",") + std::string(to_string(a));
  return out.empty() ? "-" : out;
}

// The first rank that holds `p`: its pp stage, the dp index of its ep owner, cp and tp 0.
MeshCoords first_holder(const ParamPlacement& p) {
  const AxisPlacement& ep = p.on(Axis::ep);
  return {.pp = p.on(Axis::pp).owner,
          .dp = ep.kind == PlacementKind::owned ? ep.owner : 0,
          .cp = 0,
          .tp = 0};
}

}  // namespace

std::string format_placements(const PlacementTable& table, const std::string& title) {
  const MeshShape& mesh = table.mesh();
  std::size_t width = 6;
  for (const ParamPlacement& p : table.params()) {
    width = std::max(width, p.name.size() + (p.tied_copy ? 7 : 0));
  }
  std::string out = fmt::format("{}: {} tensors on {}\n\n", title, table.params().size(),
                                mesh.to_string());
  out += fmt::format("{:<{}}  {:>14}  {:<9} {:<9} {:<9} {:<16} {:<9} {:>14}  {:<10} {}\n",
                     "tensor", width, "global shape", "pp", "dp", "cp", "tp", "ep",
                     "local shape", "grad sum", "ZeRO slice");
  for (const ParamPlacement& p : table.params()) {
    const MeshCoords c = first_holder(p);
    const Shape local = p.local_shape(mesh, c);
    const std::string zero =
        p.zero_stage == 0
            ? "-"
            : fmt::format("{} × {}",
                          zero_slice(p.zero_stage, shape_numel(local),
                                     replica_count(mesh, p.replicas), p.low_precision),
                          p.replicas == ReplicaGroup::expert ? "edp" : "dp·cp");
    out += fmt::format("{:<{}}  {:>14}  {:<9} {:<9} {:<9} {:<16} {:<9} {:>14}  {:<10} {}\n",
                       p.name + (p.tied_copy ? " (tied)" : ""), width, shape_text(p.shape),
                       to_string(p.on(Axis::pp)), to_string(p.on(Axis::dp)),
                       to_string(p.on(Axis::cp)), to_string(p.on(Axis::tp)),
                       to_string(p.on(Axis::ep)), shape_text(local),
                       axes_text(p.grad_sum_axes(mesh)), zero);
  }
  out += "\nPer rank (first tp, cp and dp rank of each stage; ep rank 0):\n";
  for (int s = 0; s < mesh.pp; ++s) {
    const MeshCoords c{.pp = s, .dp = 0, .cp = 0, .tp = 0};
    std::int64_t elements = 0;
    const std::vector<const ParamPlacement*> held = table.held_by(c);
    for (const ParamPlacement* p : held) elements += shape_numel(p->local_shape(mesh, c));
    out += fmt::format("  stage {}: {} tensors, {} elements\n", s, held.size(), elements);
  }
  return out;
}

}  // namespace meshtrain::plan
