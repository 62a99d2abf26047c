// `meshtrain plan`: the planner (src/meshtrain/plan/) on the command line. One process, no MPI.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/core/error.h"
#include "meshtrain/mesh/placement.h"
#include "meshtrain/plan/claims.h"
#include "meshtrain/plan/emit.h"
#include "meshtrain/plan/nearest.h"
#include "meshtrain/plan/placements.h"
#include "meshtrain/plan/presets.h"
#include "meshtrain/plan/report.h"
#include "meshtrain/plan/search.h"

namespace meshtrain {
namespace {

// --cp as a number; 0 for "auto" (every divisor), −1 when it is neither.
std::int64_t cp_size(const std::string& text) {
  if (text == "auto") return 0;
  std::int64_t out = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return text.empty() || ec != std::errc() || ptr != text.data() + text.size() ? -1 : out;
}

bool has_claim(const PlanArgs& a) {
  return a.claim_samples_per_s.has_value() || a.claim_tokens_per_s.has_value();
}

void check_args(const PlanArgs& a) {
  std::vector<ConfigIssue> issues;
  auto require = [&](bool ok, const char* setting, std::string value, const char* rule,
                     const char* fix) {
    if (!ok) issues.push_back({setting, std::move(value), rule, fix});
  };
  // Upper bounds keep the search finite (it enumerates divisors of the devices and
  // micro-batches of the global batch) and catch typos: 2^20 devices, 2^24 sequences and 2^22
  // tokens per sequence are beyond any cluster or run planned today.
  const auto in = [](const auto& v, auto lo, auto hi) { return !v || (*v >= lo && *v <= hi); };
  const auto shown = [](const auto& v) { return v ? fmt::format("{}", *v) : std::string(); };
  require(in(a.nodes, 1, 1 << 20), "--nodes", shown(a.nodes), "must lie in [1, 2^20]",
          "use e.g. 8");
  require(in(a.seq, 1, 1 << 22), "--seq", shown(a.seq), "must lie in [1, 2^22] tokens",
          "use e.g. 4096");
  require(in(a.global_batch, 1, 1 << 24), "--global-batch", shown(a.global_batch),
          "must lie in [1, 2^24] sequences", "use e.g. 1024");
  require(!a.efficiency || (*a.efficiency > 0.0 && *a.efficiency <= 1.0), "--efficiency",
          shown(a.efficiency), "must lie in (0, 1]", "use e.g. 0.5");
  require(a.top >= 1, "--top", fmt::format("{}", a.top), "must be ≥ 1 row", "use 10");
  require(parse_enum<Precision>(a.precision).has_value(), "--precision", a.precision,
          "must be fp32, bf16 or fp16", "use bf16");
  require(a.dp_overlap >= 0.0 && a.dp_overlap <= 1.0, "--dp-overlap",
          fmt::format("{}", a.dp_overlap), "must lie in [0, 1]", "use 0 (no overlap)");
  require(a.memory_fraction > 0.0 && a.memory_fraction <= 1.0, "--memory-fraction",
          fmt::format("{}", a.memory_fraction), "must lie in (0, 1]", "use 0.9");
  require(a.max_micro_batch >= 1, "--max-micro-batch", fmt::format("{}", a.max_micro_batch),
          "must be ≥ 1", "use 64");
  require(a.cp == "auto" || cp_size(a.cp) >= 1, "--cp", a.cp, "must be a number ≥ 1 or auto",
          "use 1 (no context parallel), 4, or auto");
  require(a.cp_comm == "auto" || parse_enum<CpCommMode>(a.cp_comm).has_value(), "--cp-comm",
          a.cp_comm, "must be p2p, a2a or auto", "use auto (both searched)");
  for (const auto& [name, value] : {std::pair{"--claim-samples-per-s", a.claim_samples_per_s},
                                    std::pair{"--claim-tokens-per-s", a.claim_tokens_per_s}}) {
    require(!value || (std::isfinite(*value) && *value > 0.0), name, shown(value),
            "must be a finite number > 0 (a throughput)", "give the claimed throughput, e.g. 182");
  }
  require(!a.claim_samples_per_s || !a.claim_tokens_per_s,
          "--claim-samples-per-s / --claim-tokens-per-s", "both given",
          "give one claim: tokens/s = samples/s × --seq", "keep one of the two");
  require(!a.json || (!a.claim_samples_per_s && !a.claim_tokens_per_s), "--json", "with a claim",
          "the claim check prints text", "drop --json or the claim");
  const int outputs = int{a.json} + int{a.emit} + int{a.emit_sbatch} + int{has_claim(a)};
  require(outputs <= 1 || (!a.emit && !a.emit_sbatch), "--emit / --emit-sbatch",
          "with --json, a claim or each other",
          "the emitted flags or script are the whole output, for a shell to use",
          "give --emit or --emit-sbatch alone");
  require(!a.placements || !a.layout.empty(), "--placements", "without --layout",
          "the placement table is of one layout", "add --layout, e.g. tp=8,pp=4,dp=2");
  require(!a.placements || (!a.json && !a.emit && !a.emit_sbatch && !has_claim(a)),
          "--placements", "with --json, --emit, --emit-sbatch or a claim",
          "the placement table is printed after the layout's account, as text",
          "give --placements with --layout alone");
  if (!issues.empty()) throw ConfigError("meshtrain plan arguments", std::move(issues));
}

// The cp sizes the nearest layouts are drawn from: every divisor when the layout uses cp, none
// otherwise (a layout without cp gets proposals without it).
plan::CpChoice nearest_cp(const plan::Layout& layout) {
  return layout.cp > 1 ? plan::CpChoice{.size = 0, .comm = std::nullopt}
                       : plan::CpChoice{.size = 1, .comm = CpCommMode::p2p};
}

// The claimed throughput's implied MFU on `devices` devices (plan/claims.h).
void print_claim(const plan::ModelPreset& model, const plan::ClusterSpec& cluster,
                 const plan::TrainingSettings& settings, std::int64_t devices,
                 const PlanArgs& args) {
  const plan::ClaimCheck check =
      plan::check_claim(model.model, settings.seq, devices, cluster, settings.precision,
                        {.samples_per_s = args.claim_samples_per_s.value_or(0.0),
                         .tokens_per_s = args.claim_tokens_per_s.value_or(0.0)});
  fmt::print("{}", plan::format_claim(check, model.name));
}

// --emit / --emit-sbatch: the plan as the `meshtrain train` flags, or a batch script, and
// nothing else on stdout (plan/emit.h). A layout that does not fit is refused: its command
// would fail the trainer's own memory check, or on the cluster.
void print_emitted(const plan::Plan& p, const plan::ModelPreset& model,
                   const plan::ClusterSpec& cluster, const PlanArgs& args) {
  const std::string source = args.layout.empty() ? "meshtrain plan" : "--layout " + args.layout;
  if (!p.fits) {
    throw ConfigError(
        source,
        {{"--emit", plan::to_string(p.layout), "the layout does not fit in the device memory",
          "emit a layout that fits (run without --emit to see the accounts)"}});
  }
  const std::vector<std::string> flags = plan::train_flags(p.config, model.model);
  if (args.emit) {
    fmt::print("{}\n", plan::shell_join(flags));
    return;
  }
  if (p.layout.devices() != cluster.devices()) {
    throw ConfigError(source,
                      {{"--emit-sbatch", plan::to_string(p.layout),
                        fmt::format("the layout uses {} of the cluster's {} devices; a batch "
                                    "script allocates them all",
                                    p.layout.devices(), cluster.devices()),
                        "give a layout of all the devices, or --nodes to match"}});
  }
  fmt::print(
      "{}",
      plan::sbatch_script(
          flags, {.nodes = cluster.nodes,
                  .ranks_per_node = cluster.devices_per_node,
                  .config = args.model.ends_with(".toml") ? args.model : std::string("CONFIG.toml"),
                  .layout = fmt::format("{} ({})", plan::to_string(p.layout), model.name)}));
}

int plan_one(const plan::ModelPreset& model, const plan::ClusterSpec& cluster,
             const plan::TrainingSettings& settings, const plan::TimeSettings& time,
             const PlanArgs& args) {
  const plan::Layout layout = plan::parse_layout(args.layout, settings.global_batch);
  const std::vector<ConfigIssue> issues = plan::check_layout(model.model, layout, settings);
  // A claim is checked on the devices it names (the cluster's) whatever else is wrong with the
  // layout, and also on the layout's own devices when it uses fewer (a layout with more ranks
  // than devices cannot run at all).
  if (has_claim(args)) {
    print_claim(model, cluster, settings, cluster.devices(), args);
    if (layout.devices() < cluster.devices()) {
      print_claim(model, cluster, settings, layout.devices(), args);
    }
  }
  // Rules broken with the cluster not filled, or more ranks than devices: name what is wrong and
  // show the nearest valid layouts that fill the cluster (nearest.h).
  const bool unfilled = layout.devices() != cluster.devices();
  if ((!issues.empty() && unfilled) || layout.devices() > cluster.devices()) {
    const plan::LayoutDiagnosis d = plan::diagnose_layout(
        model.model, layout, settings, cluster, time, args.max_micro_batch, 6, nearest_cp(layout));
    fmt::print("{}", plan::format_proposals(d, layout, cluster));
    throw ConfigError("--layout " + args.layout, d.issues);
  }
  if (!issues.empty()) throw ConfigError("--layout " + args.layout, issues);
  const plan::Plan p = plan::account(model.model, layout, settings, cluster, time);
  if (args.emit || args.emit_sbatch) {
    print_emitted(p, model, cluster, args);
    return 0;
  }
  if (args.json) {
    fmt::print("{}", plan::to_json(p, cluster));
    return 0;
  }
  fmt::print("{}", plan::format_table({p}, cluster, 1));
  fmt::print("{}\n", plan::format_memory_bar(p, cluster));
  if (!p.fits) {
    fmt::print("Does not fit: {:.1f} GiB per device over the usable {:.1f} GiB.\n",
               p.peak.total() / (1024.0 * 1024.0 * 1024.0),
               args.memory_fraction * cluster.memory_bytes / (1024.0 * 1024.0 * 1024.0));
  }
  if (layout.devices() < cluster.devices()) {
    fmt::print("Note: the layout uses {} of the cluster's {} devices.\n", layout.devices(),
               cluster.devices());
  }
  if (args.explain) fmt::print("\n{}", plan::format_explain(p));
  if (args.placements) {
    fmt::print("\n{}", plan::format_placements(placement_table(p.config),
                                               fmt::format("Placements of {}", model.name)));
  }
  return 0;
}

int plan_search(const plan::ModelPreset& model, const plan::ClusterSpec& cluster,
                const plan::TrainingSettings& settings, const plan::TimeSettings& time,
                const PlanArgs& args) {
  if (has_claim(args)) {
    print_claim(model, cluster, settings, cluster.devices(), args);
    fmt::print("\n");
  }
  const plan::SearchResult result = plan::search(
      model.model, settings, cluster, time, args.max_micro_batch,
      {.size = cp_size(args.cp), .comm = parse_enum<CpCommMode>(args.cp_comm)});  // auto: nullopt
  if (args.emit || args.emit_sbatch) {
    if (result.ranked.empty()) {
      throw ConfigError("meshtrain plan", {{"--emit", fmt::format("{} valid layouts", result.valid),
                                            "no layout fits in the device memory",
                                            "run without --emit to see the smallest layout"}});
    }
    print_emitted(result.ranked.front(), model, cluster, args);
    return 0;
  }
  if (args.json) {
    fmt::print("{}", plan::to_json(result, cluster, static_cast<std::size_t>(args.top)));
    return result.ranked.empty() ? 2 : 0;
  }
  fmt::print(
      "{} on {} × {} ({} devices, {:.0f} GiB each), seq {}, global batch {}, {}: {} "
      "valid layouts, {} fit\n\n",
      model.name, cluster.nodes, cluster.name, cluster.devices(),
      cluster.memory_bytes / (1024.0 * 1024.0 * 1024.0), settings.seq, settings.global_batch,
      to_string(settings.precision), result.valid, result.fitting);
  fmt::print("{}\n",
             plan::format_table(result.ranked, cluster, static_cast<std::size_t>(args.top)));
  for (std::size_t i = 0; i < std::min(static_cast<std::size_t>(args.top), result.ranked.size());
       ++i) {
    fmt::print("{:>3}  {}\n", i + 1, plan::format_memory_bar(result.ranked[i], cluster));
  }
  fmt::print("\n{}\n", plan::recommendation(result));
  if (args.explain && !result.ranked.empty()) {
    fmt::print("\n{}", plan::format_explain(result.ranked.front()));
  }
  return result.ranked.empty() ? 2 : 0;
}

}  // namespace

int run_plan(const PlanArgs& args) {
  return run_with_exit_codes("plan", [&] {
    check_args(args);
    const plan::ModelPreset model = plan::model_from(args.model);
    plan::ClusterSpec cluster = plan::cluster_from(args.cluster);
    if (args.nodes) cluster.nodes = *args.nodes;
    if (cluster.devices() > (1 << 20)) {
      throw ConfigError(args.cluster,
                        {{"nodes × devices_per_node", fmt::format("{}", cluster.devices()),
                          "must be at most 2^20 devices", "use fewer nodes"}});
    }
    const std::int64_t cp = cp_size(args.cp);
    if (cp > 1 && cluster.devices() % cp != 0) {
      throw ConfigError(
          "--cp", {{"--cp", args.cp, fmt::format("must divide the {} devices", cluster.devices()),
                    "use a divisor of the devices, or auto"}});
    }
    plan::TrainingSettings settings{.seq = args.seq.value_or(model.model.block_size),
                                    .global_batch = args.global_batch.value_or(cluster.devices()),
                                    .precision = *parse_enum<Precision>(args.precision)};
    const plan::TimeSettings time{.efficiency = args.efficiency.value_or(0.0),
                                  .dp_overlap = args.dp_overlap,
                                  .usable_memory_fraction = args.memory_fraction};
    return args.layout.empty() ? plan_search(model, cluster, settings, time, args)
                               : plan_one(model, cluster, settings, time, args);
  });
}

}  // namespace meshtrain
