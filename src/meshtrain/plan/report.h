// src/meshtrain/plan/report.h
//
// What `meshtrain plan` prints: the ranked table, a memory bar per layout, the recommendation
// in one sentence, the --explain listing of every term, and the JSON form. Text only; no I/O.
// Uses: plan/search, plan/accounting.
#pragma once

#include <cstddef>
#include <string>

#include "meshtrain/plan/search.h"

namespace meshtrain::plan {

/// Table rows: rank, layout, memory/device (GiB and % of the device), dp/tp/pp time (and cp when
/// a row has cp > 1), bubble,
/// step time, tokens/s, MFU — the first `top` plans.
std::string format_table(const std::vector<Plan>& plans, const ClusterSpec& cluster,
                         std::size_t top);

/// One line per plan: a bar of `width` characters split by category (P params, G grads,
/// O optimizer, A activations, C comm, · free) against the device memory.
std::string format_memory_bar(const Plan& plan, const ClusterSpec& cluster, std::size_t width = 50);

/// "Use tp=8 pp=4 ... : fastest of N fitting layouts, 12.3 s/step at 41 % MFU; ..." — one
/// sentence with the reason (the next best and what it loses).
std::string recommendation(const SearchResult& result);

/// Every term of the plan: name, value with unit, formula.
std::string format_explain(const Plan& plan);

/// The plans (and the search counts) as JSON text.
std::string to_json(const SearchResult& result, const ClusterSpec& cluster, std::size_t top);
std::string to_json(const Plan& plan, const ClusterSpec& cluster);

}  // namespace meshtrain::plan
