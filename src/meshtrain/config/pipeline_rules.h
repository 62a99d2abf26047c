// src/meshtrain/config/pipeline_rules.h — the rules of pipeline parallelism as pure functions
// of the config (DESIGN invariant 9), shared by check_config, the schedules of parallel/pp and
// the planner: which schedules exist and what each needs, and how the layers are cut into
// pp × virtual_stages model chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

/// Problems of a schedule over `pp` ranks with `v` model chunks per rank and `m` micro-batches
/// per step: pp, v, m < 1; v > 1 for a schedule other than interleaved_1f1b;
/// interleaved_1f1b with pp < 2, v < 2 or m % pp ≠ 0 (its micro-batches go round the ranks in
/// groups of pp; Narayanan et al. 2021, §2.2). Each names parallel.pp_schedule, parallel.pp,
/// parallel.virtual_stages or training.accumulation (= micro-batches per step), with the
/// value, the rule and a fix.
std::vector<ConfigIssue> check_schedule(PipelineSchedule schedule, std::int64_t pp, std::int64_t v,
                                        std::int64_t m);

/// Layers of each of the pp·v model chunks, in global chunk order: parallel.pp_layers when set
/// ("3,3,2" — one count per chunk), else an even split where the first n_layer mod (pp·v)
/// chunks take one layer more. Empty when the split is invalid (check_pipeline says why).
std::vector<std::int64_t> layers_per_chunk(const Config& config);

/// check_schedule for the config, plus the layer split: every chunk gets ≥ 1 layer, and an
/// explicit parallel.pp_layers has pp·v positive entries summing to model.n_layer (a split
/// that drops layers is an error, never silent).
void check_pipeline(const Config& config, std::vector<ConfigIssue>& issues);

}  // namespace meshtrain
