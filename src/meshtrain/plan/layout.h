// src/meshtrain/plan/layout.h
//
// A layout (how one training step is spread over the devices) and the enumeration of every
// layout of N devices for a global batch. Each layout is turned into a meshtrain Config and
// checked with the trainer's own check_config (config/validate.h): the planner has no rules
// of its own. Uses: config, core.
//
// Placement rule (shared/DESIGN.md, "The mesh"): rank = ((p·dp + d)·cp + c)·tp + t, tp
// fastest, then cp, dp, pp slowest; ranks fill nodes in order. So tp stays inside a node
// whenever tp ≤ devices per node, then cp, dp and pp take the next strides, and a group runs
// on the inter-node link as soon as its ranks span more than one node.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/cluster.h"

namespace meshtrain::plan {

/// One way to run a step. Sequences: micro_batch × accumulation × dp = the global batch.
struct Layout {
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::int64_t v = 1;  // model chunks per pipeline rank (interleaved_1f1b: ≥ 2)
  std::int64_t dp = 1;
  std::int64_t cp = 1;
  std::int64_t ep = 1;
  CpCommMode cp_comm = CpCommMode::p2p;  // with cp > 1: p2p (ring attention) | a2a (Ulysses)
  std::int64_t zero_stage = 0;
  std::int64_t micro_batch = 1;   // sequences per micro-batch (b)
  std::int64_t accumulation = 1;  // micro-batches per step per dp rank (m)
  RecomputeMode recompute = RecomputeMode::none;
  bool sequence_parallel = false;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;

  std::int64_t devices() const { return tp * pp * dp * cp; }
};

/// Settings of a plan that are not the layout: what is trained and how.
struct TrainingSettings {
  std::int64_t seq = 0;           // sequence length (tokens); 0 = the model's block_size
  std::int64_t global_batch = 0;  // sequences per optimizer step
  Precision precision = Precision::bf16;
};

/// "tp=8 pp=4 v=1 dp=2 zero=1 mb=1 m=64 recompute=selective sp=1 1f1b" — the short form the
/// table and the recommendation print; with cp > 1 "cp=4(p2p)" follows dp.
std::string to_string(const Layout& layout);

/// Parses "tp=8,pp=4,dp=2,cp=2,cp_comm=a2a,zero=1,mb=1,recompute=selective,sp=true,v=1,
/// schedule=1f1b" (keys in
/// any order; missing keys keep Layout's defaults; accumulation may be given as m= or acc=,
/// else it is derived from the global batch). Throws ConfigError (setting "--layout") for an
/// unknown key, a malformed pair, a key given twice (m and acc, recompute and rc are one key),
/// an empty entry (",," or a comma at an end), a value that is not a number / bool / known name,
/// or a number out of range (a mesh size above 2^20, mb or m above 2^24, beyond int64). The
/// lower bounds (tp ≥ 1, …) are the trainer's rules, which check_layout applies.
Layout parse_layout(const std::string& text, std::int64_t global_batch);

/// The meshtrain Config that trains `model` with `layout` and `settings` (block_size = seq,
/// parallel.* and training.* from the layout, global_batch set).
Config to_config(const ModelConfig& model, const Layout& layout, const TrainingSettings& settings);

/// check_config(to_config(...), devices): the trainer's rules, context parallel's included.
std::vector<ConfigIssue> check_layout(const ModelConfig& model, const Layout& layout,
                                      const TrainingSettings& settings);

/// Which link a group of `size` ranks at rank stride `stride` runs on under the placement rule
/// above: inside a node when its ranks span one node (size·stride ≤ devices per node, and the
/// node size is a multiple of size·stride), else between nodes.
enum class LinkKind { intra_node, inter_node };
LinkKind link_of_group(std::int64_t size, std::int64_t stride, const ClusterSpec& cluster);

/// The link a ring of that group sees. Inside a node: the intra-node link. Across nodes: the
/// k ranks the group has in each node (k = min(size, devices per node / stride), at least 1)
/// each drive their own NIC, and the collective is split over k rings, one per NIC (NCCL's
/// channels on a DGX: one ring per NIC pair): bandwidth min(intra, k × inter), the inter-node
/// latency. So a dp group of all 8 GPUs of each node reduces at 8 × 25 GB/s on DGX A100
/// nodes, one with a single GPU per node (tp = 8) at 25 GB/s.
Link link_of_group_bandwidth(std::int64_t size, std::int64_t stride, const ClusterSpec& cluster);

/// Which context-parallel layouts a search considers: `size` 1 (the default: no cp, the search
/// of before), a fixed size, or 0 for every divisor of the devices; `comm` p2p, a2a, or
/// nullopt for both (plan --cp-comm auto; cp = 1 has no comm to choose).
struct CpChoice {
  std::int64_t size = 1;
  std::optional<CpCommMode> comm = CpCommMode::p2p;
};

/// Every layout of `devices` devices for settings.global_batch that check_layout accepts:
/// cp from `cp` (CpChoice), tp, pp over the divisors of devices/cp, dp = devices/(tp·pp·cp),
/// ep = 1 (a MoE model: every ep dividing dp and model.moe_experts), v ∈ {1} or {2, 3, 4} for interleaved_1f1b, every ZeRO stage (only 0
/// when dp·cp = 1: there is nothing to shard over), every
/// micro-batch dividing global_batch/dp up to `max_micro_batch`, recompute none/selective/full,
/// sequence parallelism on/off when tp > 1, and every schedule when pp > 1 (1f1b when pp = 1).
/// `rejected` (optional) receives, per distinct rule broken, how many candidates broke it.
struct Rejection {
  std::string setting;
  std::string rule;
  std::int64_t count = 0;
};
std::vector<Layout> enumerate_layouts(const ModelConfig& model, const TrainingSettings& settings,
                                      std::int64_t devices, std::int64_t max_micro_batch = 64,
                                      std::vector<Rejection>* rejected = nullptr,
                                      const CpChoice& cp = {});

}  // namespace meshtrain::plan
