#include "meshtrain/plan/nearest.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "meshtrain/plan/report.h"

namespace meshtrain::plan {
namespace {

int factors_changed(const Layout& a, const Layout& b) {
  return (a.tp != b.tp) + (a.pp != b.pp) + (a.dp != b.dp) + (a.cp != b.cp) + (a.ep != b.ep);
}

std::string changes(const Layout& from, const Layout& to) {
  std::string out;
  const std::pair<const char*, std::pair<std::int64_t, std::int64_t>> factors[] = {
      {"tp", {from.tp, to.tp}},
      {"pp", {from.pp, to.pp}},
      {"dp", {from.dp, to.dp}},
      {"cp", {from.cp, to.cp}},
      {"ep", {from.ep, to.ep}}};
  for (const auto& [name, values] : factors) {
    if (values.first == values.second) continue;
    out += fmt::format("{}{} {}→{}", out.empty() ? "" : ", ", name, values.first, values.second);
  }
  return out.empty() ? "none" : out;
}

ConfigIssue product_issue(const Layout& l, const ClusterSpec& cluster, const Plan* nearest) {
  return {
      "tp × pp × dp × cp",
      fmt::format("{} × {} × {} × {} = {}", l.tp, l.pp, l.dp, l.cp, l.devices()),
      fmt::format("must equal the cluster's {} devices ({} × {} per node of {}): {} ranks {} "
                  "{} devices",
                  cluster.devices(), cluster.nodes, cluster.devices_per_node, cluster.name,
                  l.devices(),
                  l.devices() > cluster.devices() ? "need more than the" : "leave idle some of the",
                  cluster.devices()),
      nearest != nullptr
          ? fmt::format("use {} (the nearest that fits; more below)", to_string(nearest->layout))
          : "no layout of the cluster's devices fits; add nodes or shorten --seq"};
}

}  // namespace

LayoutDiagnosis diagnose_layout(const ModelConfig& model, const Layout& layout,
                                const TrainingSettings& settings, const ClusterSpec& cluster,
                                const TimeSettings& time, std::int64_t max_micro_batch,
                                std::size_t top, const CpChoice& cp) {
  LayoutDiagnosis d;
  // The trainer's own rules first (e.g. ep ∤ dp), then the product rule.
  std::vector<ConfigIssue> rules = check_layout(model, layout, settings);
  if (rules.empty() && layout.devices() == cluster.devices()) return d;
  // The fastest fitting plan of each factorisation (and cp mode) of the cluster's devices.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::optional<CpCommMode>>;
  std::map<Key, Plan> best;
  const std::vector<Layout> layouts =
      enumerate_layouts(model, settings, cluster.devices(), max_micro_batch, nullptr, cp);
  std::map<Key, bool> seen;
  ParameterCountCache counts;  // one placement table per (tp, pp, v, ep)
  for (const Layout& l : layouts) {
    const Key key{l.tp, l.pp, l.dp, l.cp, l.ep,
                  l.cp > 1 ? std::optional(l.cp_comm) : std::nullopt};
    seen[key] = true;
    Plan p = account(model, l, settings, cluster, time, counts);
    if (!p.fits) continue;
    const auto it = best.find(key);
    if (it == best.end() || p.step_s < it->second.step_s) best.insert_or_assign(key, std::move(p));
  }
  d.valid = static_cast<std::int64_t>(seen.size());
  for (auto& [key, plan] : best) d.proposals.push_back(std::move(plan));
  std::stable_sort(d.proposals.begin(), d.proposals.end(), [&](const Plan& a, const Plan& b) {
    const int ca = factors_changed(layout, a.layout), cb = factors_changed(layout, b.layout);
    if (ca != cb) return ca < cb;
    return a.step_s < b.step_s;
  });
  if (d.proposals.size() > top) d.proposals.resize(top);
  for (const Plan& p : d.proposals) d.changed.push_back(factors_changed(layout, p.layout));
  d.issues = std::move(rules);
  const Plan* nearest = d.proposals.empty() ? nullptr : &d.proposals.front();
  // A factor < 1 breaks its own rule (check_layout names it); the product adds nothing.
  const bool factors = layout.tp >= 1 && layout.pp >= 1 && layout.dp >= 1 && layout.cp >= 1;
  if (layout.devices() != cluster.devices() && (factors || d.issues.empty())) {
    d.issues.push_back(product_issue(layout, cluster, nearest));
  } else if (nearest != nullptr) {
    d.issues.back().fix += fmt::format("; or use {} (the nearest valid layout that fits)",
                                       to_string(nearest->layout));
  }
  return d;
}

std::string format_diagnosis(const LayoutDiagnosis& d, const Layout& layout,
                             const ClusterSpec& cluster) {
  std::string out;
  for (const ConfigIssue& i : d.issues) {
    out += fmt::format("{} = {}: {}\n  fix: {}\n\n", i.setting, i.value, i.rule, i.fix);
  }
  return out + format_proposals(d, layout, cluster);
}

std::string format_proposals(const LayoutDiagnosis& d, const Layout& layout,
                             const ClusterSpec& cluster) {
  std::string out;
  if (d.issues.empty()) return out;
  if (d.proposals.empty()) {
    return fmt::format("none of the {} valid factorisations of {} devices fits in memory\n",
                       d.valid, cluster.devices());
  }
  out += fmt::format(
      "Nearest layouts of {} devices that fit (of {} valid factorisations; fewest factors "
      "changed, then fastest):\n",
      cluster.devices(), d.valid);
  out += format_table(d.proposals, cluster, d.proposals.size());
  for (std::size_t i = 0; i < d.proposals.size(); ++i) {
    out += fmt::format("{:>3}  changes {}\n", i + 1, changes(layout, d.proposals[i].layout));
  }
  return out;
}

}  // namespace meshtrain::plan
