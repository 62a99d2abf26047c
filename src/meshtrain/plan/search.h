// src/meshtrain/plan/search.h
//
// The search: every layout the trainer accepts for the cluster's devices (layout.h), each
// accounted (accounting.h); those that do not fit in memory dropped, the rest ranked by step
// time. Uses: plan/layout, plan/accounting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/plan/accounting.h"

namespace meshtrain::plan {

struct SearchResult {
  std::vector<Plan> ranked;         // fitting plans, fastest first
  std::int64_t candidates = 0;      // layouts enumerated before check_config
  std::int64_t valid = 0;           // accepted by check_config
  std::int64_t fitting = 0;         // of those, fitting in memory
  std::vector<Rejection> rejected;  // why candidates failed check_config
  Plan smallest;                    // the valid plan with the least memory (when none fits)
};

/// Searches the layouts of cluster.devices() devices (cp: which context-parallel sizes and
/// modes; by default none). Throws ConfigError when no layout passes
/// check_config (naming the most frequent rules broken); an empty `ranked` means none fits.
SearchResult search(const ModelConfig& model, const TrainingSettings& settings,
                    const ClusterSpec& cluster, const TimeSettings& time = {},
                    std::int64_t max_micro_batch = 64, const CpChoice& cp = {});

}  // namespace meshtrain::plan
