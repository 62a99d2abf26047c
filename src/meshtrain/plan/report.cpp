#include "meshtrain/plan/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace meshtrain::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double axis_time(const Plan& p, Axis axis) {
  for (const AxisComm& a : p.comm) {
    if (a.axis == axis) return a.time_s;
  }
  return 0.0;
}

// Bytes in GiB, or MiB below 1 GiB (the repo's small configs need a few MiB).
std::string bytes_text(double bytes) {
  if (bytes >= kGiB) return fmt::format("{:.1f} GiB", bytes / kGiB);
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

std::string seconds(double s) {
  if (s == 0.0) return "-";
  if (s < 1e-3) return fmt::format("{:.0f}µs", s * 1e6);
  if (s < 1.0) return fmt::format("{:.1f}ms", s * 1e3);
  return fmt::format("{:.2f}s", s);
}

nlohmann::ordered_json plan_json(const Plan& p, const ClusterSpec& cluster) {
  const Layout& l = p.layout;
  nlohmann::ordered_json j;
  j["layout"] = {{"tp", l.tp},
                 {"pp", l.pp},
                 {"v", l.v},
                 {"dp", l.dp},
                 {"cp", l.cp},
                 {"cp_comm", l.cp_comm},
                 {"ep", l.ep},
                 {"zero_stage", l.zero_stage},
                 {"micro_batch", l.micro_batch},
                 {"accumulation", l.accumulation},
                 {"recompute", l.recompute},
                 {"sequence_parallel", l.sequence_parallel},
                 {"schedule", l.schedule}};
  j["summary"] = to_string(l);
  const MemoryBreakdown& m = p.peak;
  j["memory_bytes"] = {{"stage", m.stage},
                       {"params", m.params},
                       {"grads", m.grads},
                       {"optimizer", m.optimizer},
                       {"activations", m.activations},
                       {"comm", m.comm},
                       {"total", m.total()},
                       {"device", cluster.memory_bytes}};
  j["fits"] = p.fits;
  nlohmann::ordered_json comm = nlohmann::ordered_json::array();
  for (const AxisComm& a : p.comm) {
    comm.push_back({{"axis", to_string(a.axis)},
                    {"size", a.size},
                    {"link", a.link == LinkKind::intra_node ? "intra_node" : "inter_node"},
                    {"bytes_per_step", a.bytes_per_step},
                    {"time_s", a.time_s}});
  }
  j["comm"] = comm;
  j["bubble"] = p.bubble;
  j["compute_s"] = p.compute_s;
  j["exposed_comm_s"] = p.exposed_comm_s;
  j["step_s"] = p.step_s;
  j["tokens_per_s"] = p.tokens_per_s;
  j["mfu"] = p.mfu;
  nlohmann::ordered_json terms = nlohmann::ordered_json::array();
  for (const Term& t : p.terms) {
    terms.push_back(
        {{"name", t.name}, {"value", t.value}, {"unit", t.unit}, {"formula", t.formula}});
  }
  j["terms"] = terms;
  return j;
}

}  // namespace

std::string format_table(const std::vector<Plan>& plans, const ClusterSpec& cluster,
                         std::size_t top) {
  // The cp column (and a layout column wide enough for "cp=4(p2p)") only when a row has cp > 1,
  // so that a table without context parallelism reads as it always did.
  const std::size_t rows = std::min(top, plans.size());
  std::size_t width = 64;
  bool cp = false, ep = false;  // the ep column likewise, when a row has ep > 1
  for (std::size_t i = 0; i < rows; ++i) {
    cp = cp || plans[i].layout.cp > 1;
    ep = ep || plans[i].layout.ep > 1;
  }
  for (std::size_t i = 0; (cp || ep) && i < rows; ++i) {
    width = std::max(width, to_string(plans[i].layout).size());
  }
  auto optional = [](bool on, const std::string& text) {
    return on ? fmt::format(" {:>8}", text) : std::string();
  };
  std::string out = fmt::format("{:>3}  {:<{}} {:>15} {:>8} {:>8} {:>8}{}{} {:>6} {:>8} {:>11} {:>5}\n",
                                "#", "layout", width, "memory/device", "dp", "tp", "pp",
                                optional(cp, "cp"), optional(ep, "ep"), "bubble", "step",
                                "tokens/s", "MFU");
  for (std::size_t i = 0; i < rows; ++i) {
    const Plan& p = plans[i];
    out += fmt::format(
        "{:>3}  {:<{}} {:>10} {:>3.0f}% {:>8} {:>8} {:>8}{}{} {:>5.1f}% {:>8} {:>11.4g} "
        "{:>4.1f}%\n",
        i + 1, to_string(p.layout), width, bytes_text(p.peak.total()),
        100.0 * p.peak.total() / cluster.memory_bytes, seconds(axis_time(p, Axis::dp)),
        seconds(axis_time(p, Axis::tp)), seconds(axis_time(p, Axis::pp)),
        optional(cp, seconds(axis_time(p, Axis::cp))), optional(ep, seconds(axis_time(p, Axis::ep))),
        100.0 * p.bubble, seconds(p.step_s), p.tokens_per_s, 100.0 * p.mfu);
  }
  return out;
}

std::string format_memory_bar(const Plan& plan, const ClusterSpec& cluster, std::size_t width) {
  const MemoryBreakdown& m = plan.peak;
  const std::pair<char, double> parts[] = {
      {'P', m.params}, {'G', m.grads}, {'O', m.optimizer}, {'A', m.activations}, {'C', m.comm}};
  const double scale = static_cast<double>(width) / std::max(cluster.memory_bytes, m.total());
  std::string bar;
  for (const auto& [symbol, bytes] : parts) {
    bar.append(static_cast<std::size_t>(std::lround(bytes * scale)), symbol);
  }
  bar.resize(std::min(bar.size(), width));
  std::string free_part(width - bar.size(), '.');
  return fmt::format("[{}{}] {} of {}  P {} G {} O {} A {} C {}", bar, free_part,
                     bytes_text(m.total()), bytes_text(cluster.memory_bytes), bytes_text(m.params),
                     bytes_text(m.grads), bytes_text(m.optimizer), bytes_text(m.activations),
                     bytes_text(m.comm));
}

std::string recommendation(const SearchResult& result) {
  if (result.ranked.empty()) {
    return fmt::format(
        "No layout fits: the smallest of the {} valid layouts ({}) needs {} per device; "
        "add devices (--nodes), shorten --seq or lower the global batch.",
        result.valid, to_string(result.smallest.layout), bytes_text(result.smallest.peak.total()));
  }
  const Plan& best = result.ranked.front();
  std::string reason = fmt::format(
      "fastest of {} fitting layouts ({} valid), {:.3g} s per step "
      "at {:.1f}% MFU, bubble {:.1f}%, {} per device",
      result.fitting, result.valid, best.step_s, 100.0 * best.mfu, 100.0 * best.bubble,
      bytes_text(best.peak.total()));
  if (result.ranked.size() > 1) {
    const Plan& next = result.ranked[1];
    reason += fmt::format("; the next, {}, is {:.1f}% slower", to_string(next.layout),
                          100.0 * (next.step_s / best.step_s - 1.0));
  }
  return fmt::format("Use {}: {}.", to_string(best.layout), reason);
}

std::string format_explain(const Plan& plan) {
  std::string out = fmt::format("{}\n", to_string(plan.layout));
  for (const Term& t : plan.terms) {
    std::string value = fmt::format("{:.6g}", t.value);
    if (!t.unit.empty()) value += " " + t.unit;
    if (t.unit == "B" && t.value >= kGiB) value += fmt::format(" ({:.2f} GiB)", t.value / kGiB);
    out += fmt::format("  {:<34} = {}\n      {}\n", t.name, value, t.formula);
  }
  return out;
}

std::string to_json(const SearchResult& result, const ClusterSpec& cluster, std::size_t top) {
  nlohmann::ordered_json j;
  j["cluster"] = {{"name", cluster.name},
                  {"devices", cluster.devices()},
                  {"devices_per_node", cluster.devices_per_node},
                  {"memory_bytes", cluster.memory_bytes}};
  j["candidates"] = result.candidates;
  j["valid"] = result.valid;
  j["fitting"] = result.fitting;
  j["recommendation"] = recommendation(result);
  nlohmann::ordered_json plans = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < std::min(top, result.ranked.size()); ++i) {
    plans.push_back(plan_json(result.ranked[i], cluster));
  }
  j["plans"] = plans;
  return j.dump(2) + "\n";
}

std::string to_json(const Plan& plan, const ClusterSpec& cluster) {
  return plan_json(plan, cluster).dump(2) + "\n";
}

}  // namespace meshtrain::plan
