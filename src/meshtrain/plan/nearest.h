// src/meshtrain/plan/nearest.h
//
// A layout whose tp × pp × dp × cp is not the cluster's device count cannot run there (seed
// 000's LongChat-32B row: 2 × 2 × 4 × 4 = 64 ranks on 16 A100s). diagnose_layout says so,
// naming the factors, and proposes the layouts of the cluster's devices nearest to it: fewest
// of the four factors changed first, then fastest among those that fit in memory (each
// factorisation shown at its fastest fitting settings: ZeRO, micro-batch, recompute, sp,
// schedule, cp_comm). Uses: plan/layout, plan/accounting, plan/search's enumeration.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/plan/accounting.h"

namespace meshtrain::plan {

struct LayoutDiagnosis {
  // The rules broken, then the product rule (not when a factor is < 1: that factor's own rule
  // says it); empty: none.
  std::vector<ConfigIssue> issues;
  std::vector<Plan> proposals;      // nearest first, then fastest; all fit, all fill the cluster
  std::vector<int> changed;         // per proposal: how many of tp, pp, dp, cp, ep differ
  std::int64_t valid = 0;           // valid factorisations of the cluster's devices considered
};

/// Checks `layout` against the trainer's rules (check_layout: e.g. ep must divide dp and the
/// experts) and cluster.devices(); when either fails, proposes the `top` nearest valid layouts
/// of cluster.devices() devices (tp, pp, dp, cp, ep: fewest changed; cp from `cp`, by default
/// every divisor and both cp_comm modes; ep every divisor of dp and the experts).
LayoutDiagnosis diagnose_layout(const ModelConfig& model, const Layout& layout,
                                const TrainingSettings& settings, const ClusterSpec& cluster,
                                const TimeSettings& time = {}, std::int64_t max_micro_batch = 64,
                                std::size_t top = 6,
                                const CpChoice& cp = {.size = 0, .comm = std::nullopt});

/// The issues, then format_proposals.
std::string format_diagnosis(const LayoutDiagnosis& diagnosis, const Layout& layout,
                             const ClusterSpec& cluster);
/// The proposals as a table, with the factors each one changes ("" without issues).
std::string format_proposals(const LayoutDiagnosis& diagnosis, const Layout& layout,
                             const ClusterSpec& cluster);

}  // namespace meshtrain::plan
