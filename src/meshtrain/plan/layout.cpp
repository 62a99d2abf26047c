#include "meshtrain/plan/layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <iterator>
#include <limits>
#include <map>

#include "meshtrain/config/validate.h"
#include "meshtrain/plan/context_parallel.h"

namespace meshtrain::plan {
namespace {

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

constexpr const char* kLayoutForm =
    "write it as tp=8,pp=4,dp=2,zero=1,mb=1,recompute=selective,sp=true,v=1,schedule=1f1b "
    "(keys: tp pp v dp cp ep zero mb m recompute sp schedule)";

[[noreturn]] void bad_layout(const std::string& value, const std::string& rule,
                             const std::string& fix = kLayoutForm) {
  throw ConfigError("--layout", {{"--layout", value, rule, fix}});
}

// The largest value of an integer key, why, and a fix: a mesh axis cannot exceed the 2^20
// devices a plan may have (the --nodes rule), a batch count the 2^24 sequences --global-batch
// may have. The lower bounds are the trainer's rules: check_layout names the setting.
struct Bound {
  std::int64_t largest;
  const char* why;
  const char* fix;
};

Bound bound_of(const std::string& key) {
  if (key == "mb" || key == "m" || key == "acc") {
    return {std::int64_t{1} << 24, "at most 2^24 (the sequences --global-batch may have)",
            "use e.g. {}=1"};
  }
  if (key == "zero") {
    return {std::numeric_limits<std::int64_t>::max(), "beyond a 64-bit integer",
            "use zero=0, 1, 2 or 3"};
  }
  return {std::int64_t{1} << 20, "a mesh size is at most 2^20 (the devices a plan may have)",
          "use a divisor of the cluster's devices, e.g. {}=8"};
}

std::int64_t parse_int(const std::string& key, const std::string& value) {
  std::int64_t out = 0;
  const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  const bool whole = !value.empty() && ptr == value.data() + value.size();
  const Bound bound = bound_of(key);
  if (whole && (ec == std::errc::result_out_of_range || out > bound.largest)) {
    bad_layout(key + "=" + value, fmt::format("{} is out of range: {}", key, bound.why),
               fmt::format(fmt::runtime(bound.fix), key));
  }
  if (!whole || ec != std::errc()) {
    bad_layout(key + "=" + value, fmt::format("{} must be an integer", key));
  }
  return out;
}

bool parse_bool(const std::string& key, const std::string& value) {
  if (value == "true" || value == "1" || value == "on") return true;
  if (value == "false" || value == "0" || value == "off") return false;
  bad_layout(key + "=" + value, fmt::format("{} must be true or false", key));
}

// The context-parallel sizes and modes a search tries (CpChoice in layout.h).
std::vector<std::pair<std::int64_t, CpCommMode>> cp_options(const CpChoice& choice,
                                                            std::int64_t devices) {
  std::vector<std::pair<std::int64_t, CpCommMode>> out;
  const std::vector<CpCommMode> comms =
      choice.comm ? std::vector<CpCommMode>{*choice.comm}
                  : std::vector<CpCommMode>{CpCommMode::p2p, CpCommMode::a2a};
  for (const std::int64_t cp :
       choice.size == 0 ? divisors(devices) : std::vector<std::int64_t>{choice.size}) {
    if (cp < 1 || devices % cp != 0) continue;
    if (cp == 1) {
      out.emplace_back(1, CpCommMode::p2p);
      continue;
    }
    for (const CpCommMode comm : comms) out.emplace_back(cp, comm);
  }
  return out;
}

// Every variant of one (tp, pp, dp, cp) factorisation: micro-batches, schedules, ZeRO stages,
// recompute, sequence parallelism.
void for_each_variant(const Layout& base, std::int64_t batch, std::int64_t max_micro_batch,
                      const std::function<void(const Layout&)>& consider) {
  const std::int64_t dp = base.dp;
  std::vector<std::int64_t> micro_batches{1};
  if (batch >= dp && batch % dp == 0) {
    micro_batches.clear();
    for (const std::int64_t b : divisors(batch / dp)) {
      if (b <= max_micro_batch) micro_batches.push_back(b);
    }
  }
  using enum PipelineSchedule;
  std::vector<std::pair<PipelineSchedule, std::int64_t>> schedules{{one_f_one_b, 1}};
  if (base.pp > 1) {
    schedules = {{one_f_one_b, 1},      {gpipe, 1},           {zb_h1, 1}, {interleaved_1f1b, 2},
                 {interleaved_1f1b, 3}, {interleaved_1f1b, 4}};
  }
  // ZeRO shards over dp × cp: with dp·cp = 1 every stage is ZeRO-0 with extra copies.
  const std::int64_t max_zero = dp * base.cp > 1 ? 3 : 0;
  for (const std::int64_t b : micro_batches) {
    for (const auto& [schedule, v] : schedules) {
      for (std::int64_t zero = 0; zero <= max_zero; ++zero) {
        for (const auto& [recompute, name, what] : kRecomputeModeNames) {
          for (const bool sp : {false, true}) {
            if (sp && base.tp == 1) continue;
            Layout l = base;
            l.v = v;
            l.zero_stage = zero;
            l.micro_batch = b;
            l.accumulation = std::max<std::int64_t>(batch / (b * dp), 1);
            l.recompute = recompute;
            l.sequence_parallel = sp;
            l.schedule = schedule;
            consider(l);
          }
        }
      }
    }
  }
}

// `value` as the enum of `key`; an unknown name is a bad layout listing the known ones.
template <ConfigEnum E>
E parse_layout_enum(const std::string& item, std::string_view key, const std::string& value) {
  const std::optional<E> parsed = parse_enum<E>(value);
  if (!parsed) bad_layout(item, fmt::format("{} must be one of: {}", key, allowed_names<E>()));
  return *parsed;
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

// The comma-separated entries of `text`, trimmed; an empty one (",," or a comma at an end) is
// an error rather than skipped, as it is likely a lost value.
std::vector<std::string> layout_items(const std::string& text) {
  std::vector<std::string> items;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    items.push_back(trim(text.substr(begin, end - begin)));
    if (end == text.size()) break;
    begin = end + 1;
  }
  const auto empty = std::find(items.begin(), items.end(), std::string());
  if (empty != items.end()) {
    std::vector<std::string> kept;
    std::copy_if(items.begin(), items.end(), std::back_inserter(kept),
                 [](const std::string& i) { return !i.empty(); });
    bad_layout(text,
               fmt::format("entry {} of {} is empty (two commas in a row, or a comma at an end)",
                           empty - items.begin() + 1, items.size()),
               kept.empty() ? std::string(kLayoutForm)
                            : fmt::format("drop the extra comma: {}", fmt::join(kept, ",")));
  }
  return items;
}

// One name for the keys that have two (m and acc, recompute and rc), so a repeat is caught.
std::string canonical_key(const std::string& key) {
  if (key == "m" || key == "acc") return "m";
  if (key == "rc") return "recompute";
  return key;
}

}  // namespace

std::string to_string(const Layout& l) {
  std::string out = fmt::format("tp={} pp={}", l.tp, l.pp);
  if (l.v > 1) out += fmt::format(" v={}", l.v);
  out += fmt::format(" dp={}", l.dp);
  if (l.cp > 1) out += fmt::format(" cp={}({})", l.cp, to_string(l.cp_comm));
  if (l.ep > 1) out += fmt::format(" ep={}", l.ep);
  out += fmt::format(" zero={} mb={} m={} rc={}", l.zero_stage, l.micro_batch, l.accumulation,
                     to_string(l.recompute));
  if (l.sequence_parallel) out += " sp";
  if (l.pp > 1) out += fmt::format(" {}", to_string(l.schedule));
  return out;
}

Layout parse_layout(const std::string& text, std::int64_t global_batch) {
  const std::vector<std::string> items = layout_items(text);
  Layout l;
  bool have_m = false;
  std::map<std::string, std::string> given;  // canonical key → its entry
  for (const std::string& item : items) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) bad_layout(item, "each entry must be key=value");
    const std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (key == "tp")
      l.tp = parse_int(key, value);
    else if (key == "pp")
      l.pp = parse_int(key, value);
    else if (key == "v")
      l.v = parse_int(key, value);
    else if (key == "dp")
      l.dp = parse_int(key, value);
    else if (key == "cp")
      l.cp = parse_int(key, value);
    else if (key == "cp_comm") {
      l.cp_comm = parse_layout_enum<CpCommMode>(item, "cp_comm", value);
    } else if (key == "ep")
      l.ep = parse_int(key, value);
    else if (key == "zero")
      l.zero_stage = parse_int(key, value);
    else if (key == "mb")
      l.micro_batch = parse_int(key, value);
    else if (key == "m" || key == "acc") {
      l.accumulation = parse_int(key, value);
      have_m = true;
    } else if (key == "recompute" || key == "rc") {
      l.recompute = parse_layout_enum<RecomputeMode>(item, "recompute", value);
    } else if (key == "sp")
      l.sequence_parallel = parse_bool(key, value);
    else if (key == "schedule")
      l.schedule = parse_layout_enum<PipelineSchedule>(item, "schedule", value);
    else
      bad_layout(item, fmt::format("unknown key '{}'", key));
    const auto [first, fresh] = given.emplace(canonical_key(key), item);
    if (!fresh) {
      bad_layout(item,
                 fmt::format("{} is given twice ({}, then {})", first->first, first->second, item),
                 fmt::format("give {} once: keep {} or {}", first->first, first->second, item));
    }
  }
  if (!have_m && l.micro_batch >= 1 && l.dp >= 1) {
    l.accumulation = std::max<std::int64_t>(global_batch / (l.micro_batch * l.dp), 1);
  }
  return l;
}

Config to_config(const ModelConfig& model, const Layout& l, const TrainingSettings& settings) {
  Config c;
  c.model = model;
  if (settings.seq > 0) c.model.block_size = settings.seq;
  c.training.micro_batch = l.micro_batch;
  c.training.accumulation = l.accumulation;
  c.training.global_batch = settings.global_batch;
  c.training.precision = settings.precision;
  c.training.recompute = l.recompute;
  c.parallel.tp = l.tp;
  c.parallel.pp = l.pp;
  c.parallel.dp = l.dp;
  c.parallel.cp = l.cp;
  c.parallel.cp_comm = l.cp_comm;
  c.parallel.ep = l.ep;
  c.parallel.virtual_stages = l.v;
  c.parallel.zero_stage = l.zero_stage;
  c.parallel.sequence_parallel = l.sequence_parallel;
  c.parallel.pp_schedule = l.schedule;
  c.source = "layout " + to_string(l);
  return c;
}

std::vector<ConfigIssue> check_layout(const ModelConfig& model, const Layout& layout,
                                      const TrainingSettings& settings) {
  const std::int64_t devices = layout.devices();
  const Config config = to_config(model, layout, settings);
  return check_config(config, static_cast<int>(std::clamp<std::int64_t>(devices, 0, 1 << 30)));
}

LinkKind link_of_group(std::int64_t size, std::int64_t stride, const ClusterSpec& cluster) {
  const std::int64_t span = size * stride;
  const bool inside = span <= cluster.devices_per_node && cluster.devices_per_node % span == 0;
  return inside || size <= 1 ? LinkKind::intra_node : LinkKind::inter_node;
}

Link link_of_group_bandwidth(std::int64_t size, std::int64_t stride, const ClusterSpec& cluster) {
  if (link_of_group(size, stride, cluster) == LinkKind::intra_node) return cluster.intra_node;
  const std::int64_t per_node = std::max<std::int64_t>(
      1, std::min(size, cluster.devices_per_node / std::max<std::int64_t>(1, stride)));
  Link link = cluster.inter_node;
  link.bandwidth_bytes_per_s =
      std::min(cluster.intra_node.bandwidth_bytes_per_s,
               static_cast<double>(per_node) * cluster.inter_node.bandwidth_bytes_per_s);
  return link;
}

std::vector<Layout> enumerate_layouts(const ModelConfig& model, const TrainingSettings& settings,
                                      std::int64_t devices, std::int64_t max_micro_batch,
                                      std::vector<Rejection>* rejected, const CpChoice& cp_choice) {
  std::vector<Layout> out;
  std::map<std::pair<std::string, std::string>, std::int64_t> reasons;
  const auto consider = [&](const Layout& l) {
    const std::vector<ConfigIssue> issues = check_layout(model, l, settings);
    if (issues.empty()) {
      out.push_back(l);
      return;
    }
    for (const ConfigIssue& issue : issues) ++reasons[{issue.setting, issue.rule}];
  };
  for (const auto& [cp, comm] : cp_options(cp_choice, devices)) {
    for (const std::int64_t tp : divisors(devices / cp)) {
      for (const std::int64_t pp : divisors(devices / (cp * tp))) {
        const std::int64_t dp = devices / (cp * tp * pp);
        // Expert parallel (MoE models): every ep dividing both dp and the experts.
        for (const std::int64_t ep : divisors(dp)) {
          if (ep > 1 && (model.moe_experts < 1 || model.moe_experts % ep != 0)) continue;
          const Layout base{.tp = tp, .pp = pp, .dp = dp, .cp = cp, .ep = ep, .cp_comm = comm};
          for_each_variant(base, settings.global_batch, max_micro_batch, consider);
        }
      }
    }
  }
  if (rejected != nullptr) {
    rejected->clear();
    for (const auto& [key, count] : reasons) {
      rejected->push_back({.setting = key.first, .rule = key.second, .count = count});
    }
    std::sort(rejected->begin(), rejected->end(),
              [](const Rejection& a, const Rejection& b) { return a.count > b.count; });
  }
  return out;
}

}  // namespace meshtrain::plan
