#include "meshtrain/plan/cluster.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "meshtrain/core/error.h"

namespace meshtrain::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kGB = 1e9;
constexpr double kTera = 1e12;

// Latencies per ring step are assumptions of the order of NCCL's per-step cost (a few µs on
// NVLink, ≈ 10 µs across InfiniBand); they matter only for small messages (tp at small
// micro-batches). docs/planner.md lists them among the figures the validation calibrates.
constexpr Link kNvlink3{.bandwidth_bytes_per_s = 300 * kGB, .latency_s = 5e-6};
constexpr Link kNvlink4{.bandwidth_bytes_per_s = 450 * kGB, .latency_s = 5e-6};
constexpr Link kIbHdr{.bandwidth_bytes_per_s = 25 * kGB, .latency_s = 10e-6};
constexpr Link kIbNdr{.bandwidth_bytes_per_s = 50 * kGB, .latency_s = 10e-6};

std::vector<ClusterSpec> presets() {
  std::vector<ClusterSpec> out;
  // NVIDIA A100 Tensor Core GPU datasheet (2021), SXM 80GB: FP32 19.5, TF32 156, BF16 312
  // TFLOP/s dense; NVLink 3 600 GB/s per GPU = both directions of 12 links × 25 GB/s, so 300
  // GB/s each way. DGX A100 datasheet: 8 × 200 Gb/s HDR InfiniBand (one ConnectX-6 per GPU) =
  // 25 GB/s per GPU and direction. 80 GB of HBM2e is 81,920 MiB (nvidia-smi) = 80 GiB.
  out.push_back({.name = "8xA100-80GB",
                 .devices_per_node = 8,
                 .nodes = 1,
                 .memory_bytes = 80 * kGiB,
                 .peak_flops_fp32 = 19.5 * kTera,
                 .peak_flops_tf32 = 156 * kTera,
                 .peak_flops_16bit = 312 * kTera,
                 .intra_node = kNvlink3,
                 .inter_node = kIbHdr,
                 .memory_bandwidth_bytes_per_s = 2039 * kGB,  // A100 SXM 80GB HBM2e
                 .default_efficiency = 0.5,
                 .source = "NVIDIA A100 and DGX A100 datasheets"});
  // NVIDIA H100 Tensor Core GPU datasheet, SXM5: FP32 67, TF32 494.5, BF16 989 TFLOP/s dense
  // (the datasheet's 1,979 is with 2:4 sparsity); NVLink 4 900 GB/s per GPU (450 each way).
  // DGX H100: 8 × 400 Gb/s NDR (ConnectX-7 per GPU) = 50 GB/s per GPU and direction.
  out.push_back({.name = "8xH100-80GB",
                 .devices_per_node = 8,
                 .nodes = 1,
                 .memory_bytes = 80 * kGiB,
                 .peak_flops_fp32 = 67 * kTera,
                 .peak_flops_tf32 = 494.5 * kTera,
                 .peak_flops_16bit = 989 * kTera,
                 .intra_node = kNvlink4,
                 .inter_node = kIbNdr,
                 .memory_bandwidth_bytes_per_s = 3350 * kGB,  // H100 SXM5 HBM3
                 .default_efficiency = 0.5,
                 .source = "NVIDIA H100 and DGX H100 datasheets"});
  // NVIDIA H200 datasheet, SXM: 141 GB HBM3e, the H100's compute (BF16 989 TFLOP/s dense),
  // NVLink 900 GB/s; DGX H200: 8 × 400 Gb/s NDR. HBM capacities are binary units.
  out.push_back({.name = "8xH200",
                 .devices_per_node = 8,
                 .nodes = 1,
                 .memory_bytes = 141 * kGiB,
                 .peak_flops_fp32 = 67 * kTera,
                 .peak_flops_tf32 = 494.5 * kTera,
                 .peak_flops_16bit = 989 * kTera,
                 .intra_node = kNvlink4,
                 .inter_node = kIbNdr,
                 .memory_bandwidth_bytes_per_s = 4800 * kGB,  // H200 SXM HBM3e
                 .default_efficiency = 0.5,
                 .source = "NVIDIA H200 and DGX H200 datasheets"});
  // This machine, from measured figures (docs/performance.md): one rank per core, 2 cores;
  // "peak" is the measured 1-thread GEMM rate (gemm_bench: f32 146.5, bf16 79.6 GFLOP/s), so
  // the efficiency is the step's FLOP rate over the GEMM rate (56.9 % measured on the main
  // job). The link is the all-reduce between 2 local ranks: a line through the table's
  // 0.25 MiB (4.24 GB/s) and 4 MiB (7.13 GB/s) points gives 7.5 GB/s and 13 µs per step.
  // Memory: half of the machine's 23 GiB per rank.
  const Link shared_memory{.bandwidth_bytes_per_s = 7.5 * kGB, .latency_s = 13e-6};
  out.push_back({.name = "cpu-this-machine",
                 .devices_per_node = 2,
                 .nodes = 1,
                 .memory_bytes = 11.5 * kGiB,
                 .peak_flops_fp32 = 146.5e9,
                 .peak_flops_tf32 = 0.0,
                 .peak_flops_16bit = 79.6e9,
                 .intra_node = shared_memory,
                 .inter_node = shared_memory,
                 .default_efficiency = 0.57,
                 .source = "docs/performance.md (gemm_bench, allreduce_bench)"});
  return out;
}

[[noreturn]] void fail(const std::string& source, const std::string& setting,
                       const std::string& value, const std::string& rule, const std::string& fix) {
  throw ConfigError(source, {{setting, value, rule, fix}});
}

double positive(const toml::node_view<const toml::node>& node, const std::string& key,
                const std::string& source, bool required = true) {
  const std::optional<double> value = node.value<double>();
  if (!value) {
    if (!required) return 0.0;
    fail(source, key, "(missing)", "the cluster file must give it as a number",
         "see docs/planner.md, \"Cluster files\"");
  }
  if (!(*value > 0.0) || !std::isfinite(*value)) {
    fail(source, key, fmt::format("{}", *value), "must be a finite number > 0",
         "give a positive number");
  }
  return *value;
}

// Every key of a cluster file (docs/planner.md, "Cluster files"): a misspelt key would
// otherwise be ignored and its default used without a word.
void check_keys(const toml::table& root, const std::string& source) {
  const std::set<std::string> top = {"name",       "devices_per_node", "nodes",
                                     "memory_gib", "memory_bytes",     "peak_tflops",
                                     "intra_node", "inter_node",       "efficiency"};
  const std::map<std::string, std::set<std::string>> nested = {
      {"peak_tflops", {"fp32", "tf32", "bf16"}},
      {"intra_node", {"bandwidth_gb_per_s", "latency_us"}},
      {"inter_node", {"bandwidth_gb_per_s", "latency_us"}}};
  for (const auto& [key, node] : root) {
    const std::string k(key.str());
    if (!top.contains(k)) {
      fail(source, k, "(unknown key)", "not a cluster-file setting",
           fmt::format("use {} (docs/planner.md, \"Cluster files\")", fmt::join(top, ", ")));
    }
    const auto sub = nested.find(k);
    if (sub == nested.end() || !node.is_table()) continue;
    for (const auto& [inner, value] : *node.as_table()) {
      if (!sub->second.contains(std::string(inner.str()))) {
        fail(source, fmt::format("{}.{}", k, inner.str()), "(unknown key)",
             "not a cluster-file setting", fmt::format("use {}", fmt::join(sub->second, ", ")));
      }
    }
  }
}

}  // namespace

double peak_flops_for(const ClusterSpec& cluster, std::string_view precision) {
  if (precision == "bf16" || precision == "fp16") return cluster.peak_flops_16bit;
  if (precision == "tf32" && cluster.peak_flops_tf32 > 0.0) return cluster.peak_flops_tf32;
  return cluster.peak_flops_fp32;
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names;
  for (const ClusterSpec& c : presets()) names.push_back(c.name);
  return names;
}

ClusterSpec cluster_from(const std::string& name_or_path) {
  if (name_or_path.ends_with(".toml")) return load_cluster_file(name_or_path);
  for (const ClusterSpec& c : presets()) {
    if (c.name == name_or_path) return c;
  }
  fail("--cluster", "--cluster", name_or_path, "unknown cluster preset",
       fmt::format("use one of {}, or a cluster TOML file (docs/planner.md)",
                   fmt::join(cluster_preset_names(), ", ")));
}

ClusterSpec load_cluster_file(const std::filesystem::path& path) {
  const std::string source = path.string();
  toml::table parsed;
  try {
    parsed = toml::parse_file(source);
  } catch (const toml::parse_error& e) {
    fail(source, "cluster file", source, std::string(e.description()),
         e.source().begin
             ? fmt::format("fix line {}, column {}", e.source().begin.line, e.source().begin.column)
             : "check that the file exists and is TOML");
  }
  const toml::table& root_view = parsed;
  check_keys(parsed, source);
  ClusterSpec c;
  c.name = root_view["name"].value_or(path.stem().string());
  c.devices_per_node = static_cast<std::int64_t>(
      positive(root_view["devices_per_node"], "devices_per_node", source));
  c.nodes = static_cast<std::int64_t>(positive(root_view["nodes"], "nodes", source));
  const double gib = positive(root_view["memory_gib"], "memory_gib", source, false);
  c.memory_bytes =
      gib > 0.0 ? gib * kGiB : positive(root_view["memory_bytes"], "memory_bytes", source);
  c.peak_flops_fp32 =
      positive(root_view["peak_tflops"]["fp32"], "peak_tflops.fp32", source) * kTera;
  c.peak_flops_tf32 =
      positive(root_view["peak_tflops"]["tf32"], "peak_tflops.tf32", source, false) * kTera;
  const double bf16 = positive(root_view["peak_tflops"]["bf16"], "peak_tflops.bf16", source, false);
  c.peak_flops_16bit = bf16 > 0.0 ? bf16 * kTera : c.peak_flops_fp32;
  for (const auto& [key, link] :
       {std::pair{"intra_node", &c.intra_node}, std::pair{"inter_node", &c.inter_node}}) {
    link->bandwidth_bytes_per_s = positive(root_view[key]["bandwidth_gb_per_s"],
                                           fmt::format("{}.bandwidth_gb_per_s", key), source) *
                                  kGB;
    link->latency_s =
        positive(root_view[key]["latency_us"], fmt::format("{}.latency_us", key), source, false) *
        1e-6;
  }
  const double efficiency = root_view["efficiency"].value_or(0.5);
  if (!(efficiency > 0.0 && efficiency <= 1.0)) {
    fail(source, "efficiency", fmt::format("{}", efficiency), "must lie in (0, 1]", "use 0.5");
  }
  c.default_efficiency = efficiency;
  c.source = source;
  return c;
}

}  // namespace meshtrain::plan
