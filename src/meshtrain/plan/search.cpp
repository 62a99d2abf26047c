#include "meshtrain/plan/search.h"

#include <fmt/format.h>

#include <algorithm>

#include "meshtrain/core/error.h"

namespace meshtrain::plan {

SearchResult search(const ModelConfig& model, const TrainingSettings& settings,
                    const ClusterSpec& cluster, const TimeSettings& time,
                    std::int64_t max_micro_batch, const CpChoice& cp) {
  SearchResult result;
  const std::vector<Layout> layouts =
      enumerate_layouts(model, settings, cluster.devices(), max_micro_batch, &result.rejected, cp);
  for (const Rejection& r : result.rejected) result.candidates += r.count;
  result.valid = static_cast<std::int64_t>(layouts.size());
  result.candidates += result.valid;  // a rejected candidate may break several rules: ≥
  if (layouts.empty()) {
    std::vector<ConfigIssue> issues;
    for (std::size_t i = 0; i < std::min<std::size_t>(result.rejected.size(), 3); ++i) {
      const Rejection& r = result.rejected[i];
      issues.push_back({r.setting, fmt::format("(broken by {} layouts)", r.count), r.rule,
                        "change --nodes, --global-batch or --seq, or the model"});
    }
    throw ConfigError(fmt::format("no layout of {} devices ({} × {}) for global batch {} passes "
                                  "the trainer's rules; the most frequent reasons:",
                                  cluster.devices(), cluster.nodes, cluster.devices_per_node,
                                  settings.global_batch),
                      std::move(issues));
  }
  bool have_smallest = false;
  ParameterCountCache counts;  // one placement table per (tp, pp, v, ep)
  for (const Layout& l : layouts) {
    Plan p = account(model, l, settings, cluster, time, counts);
    if (!have_smallest || p.peak.total() < result.smallest.peak.total()) {
      result.smallest = p;
      have_smallest = true;
    }
    if (p.fits) result.ranked.push_back(std::move(p));
  }
  result.fitting = static_cast<std::int64_t>(result.ranked.size());
  std::stable_sort(result.ranked.begin(), result.ranked.end(), [](const Plan& a, const Plan& b) {
    // Equal times (layouts differing only in what costs no time): the one
    // with more memory headroom first.
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    return a.peak.total() < b.peak.total();
  });
  return result;
}

}  // namespace meshtrain::plan
