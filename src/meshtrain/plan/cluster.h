// src/meshtrain/plan/cluster.h
//
// The machines a plan is made for: devices per node, nodes, memory and peak FLOP/s per device,
// and the bandwidth and latency of the two links a collective can run on (inside a node and
// between nodes). Presets carry their sources; a TOML file describes any other cluster.
// Uses: config (errors), core. Knows nothing of models or layouts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace meshtrain::plan {

/// One link class as a ring collective sees it: the bandwidth each device can push in one
/// direction at the same time as every other device of its ring (bytes/s), and the latency
/// of one message step (s).
struct Link {
  double bandwidth_bytes_per_s = 0.0;
  double latency_s = 0.0;
};

/// A homogeneous cluster: `nodes` nodes of `devices_per_node` identical devices.
struct ClusterSpec {
  std::string name;
  std::int64_t devices_per_node = 1;
  std::int64_t nodes = 1;
  double memory_bytes = 0.0;                  // per device, bytes
  double peak_flops_fp32 = 0.0;               // dense, per device, FLOP/s
  double peak_flops_tf32 = 0.0;               // dense, per device, FLOP/s (0: none; fp32 is used)
  double peak_flops_16bit = 0.0;              // dense bf16/fp16 with fp32 accumulation, FLOP/s
  Link intra_node;                            // e.g. NVLink, per device and direction
  Link inter_node;                            // e.g. InfiniBand, per device (one NIC per GPU)
  double memory_bandwidth_bytes_per_s = 0.0;  // HBM, per device (0: unknown; no memory-bound term)
  double default_efficiency = 0.5;  // achieved / peak FLOP/s assumed for the matrix products
  std::string source;               // where the figures come from

  std::int64_t devices() const { return devices_per_node * nodes; }
};

/// The peak FLOP/s per device the matrix products run at under `precision` ("fp32", "tf32",
/// "bf16", "fp16"): the 16-bit peak for bf16/fp16, tf32 for "tf32" (fp32 when the device has
/// none), fp32 otherwise.
double peak_flops_for(const ClusterSpec& cluster, std::string_view precision);

/// The preset names, in the order `meshtrain plan` lists them.
std::vector<std::string> cluster_preset_names();

/// A preset by name ("8xA100-80GB", "8xH100-80GB", "8xH200", "cpu-this-machine"), or a
/// cluster TOML file when `name_or_path` ends in ".toml". Throws ConfigError naming the known
/// presets for an unknown name, and for a file with missing or invalid keys.
ClusterSpec cluster_from(const std::string& name_or_path);

/// Reads a cluster TOML file (docs/planner.md, "Cluster files"):
///   name = "..."            devices_per_node = 8       nodes = 4
///   memory_gib = 80         (or memory_bytes)
///   [peak_tflops] fp32 = 19.5  tf32 = 156  bf16 = 312
///   [intra_node] bandwidth_gb_per_s = 300  latency_us = 5
///   [inter_node] bandwidth_gb_per_s = 25   latency_us = 10
///   efficiency = 0.5
/// Throws ConfigError for a missing file, a syntax error or a missing/non-positive key.
ClusterSpec load_cluster_file(const std::filesystem::path& path);

}  // namespace meshtrain::plan
