// src/meshtrain/plan/moe.h
//
// Mixture of experts in the planner (docs/moe.md, docs/planner.md "Mixture of experts"): which
// blocks are MoE, total vs active parameters, the split of a rank's parameters into dense ones
// (reduced and ZeRO-sliced over dp × cp) and expert ones (E/ep experts per MoE layer, whole on
// every tp rank — expert tp = 1 in this version — reduced and sliced over the
// expert-data-parallel group of (dp·cp)/ep ranks: mesh/placement.h, parallel/dp/zero.h),
// and the ep all-to-all traffic of parallel/ep/expert_parallel.h per step. Uses: config,
// plan/accounting, plan/formulas.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/config/config.h"
#include "meshtrain/plan/accounting.h"

namespace meshtrain::plan {

/// model.moe_experts > 0.
bool is_moe(const ModelConfig& model);
/// Whether block `layer` (0-based, global) is a MoE block: layer % moe_layer_freq == 0.
bool is_moe_layer(const ModelConfig& model, std::int64_t layer);
/// MoE blocks among blocks [first, first + count).
std::int64_t moe_layers_in(const ModelConfig& model, std::int64_t first, std::int64_t count);
/// Elements of one expert: w1, w3 [F, C] and w2 [C, F] = 3·C·F_moe.
double expert_elements(const ModelConfig& model);

/// Ranks an expert weight's gradient is reduced over and its optimizer state ZeRO-sliced over:
/// (dp·cp)/ep (= dp·cp when ep = 1).
std::int64_t expert_group_size(const Config& config);

/// The rank's dense parameters (Ψ − Ψ_e) and its expert parameters (Ψ_e), as ParameterCounts the
/// dense formulas of accounting.h take: the expert view holds only expert elements (no
/// replicated, tied or embedding elements), its units are the MoE blocks' expert sets.
ParameterCounts dense_part(const ParameterCounts& stage_params);
ParameterCounts expert_part(const ParameterCounts& stage_params);
/// `config` with its ZeRO / reduction group shrunk to the expert-data-parallel group, so that
/// accounting.h's dp formulas (N = dp·cp) give the expert terms with N = (dp·cp)/ep.
Config expert_group_config(const Config& config);

/// Model-state bytes of a rank (params, grads, optimizer): dense elements over dp·cp, expert
/// elements over the expert-data-parallel group.
MemoryBreakdown model_state_bytes_moe(const Config& config, const ParameterCounts& stage_params);
/// dp bytes per step and their time: the dense group's plus the expert group's collectives (the
/// loss and grad-norm scalars once). Dense models: dp_bytes_per_step / dp_time_per_step.
double dp_bytes_per_step_moe(const Config& config, const ParameterCounts& stage_params);
double dp_time_per_step_moe(const Config& config, const ParameterCounts& stage_params,
                            const Link& link, const TimeSettings& time = {});
/// comm_buffer_bytes plus the expert group's ZeRO buffers (its own, in ZeroSharding).
double comm_buffer_bytes_moe(const Config& config, const ParameterCounts& stage_params);

/// The ep exchange of one MoE block and micro-batch on one rank (parallel/ep/expert_parallel.h), as
/// the ep group's ProcessGroup counts it (each op's input bytes, the rank's own block
/// included). N = b·s/cp tokens (/tp with sequence parallelism), routing assumed uniform:
///   counts: an all_to_all of the E per-expert counts, 4·E bytes;
///   dispatch: all_to_allv of the N·k packed rows, 4·C·N·k bytes (dropless; with a capacity
///       factor f ≥ 1 uniform routing drops nothing, and each expert keeps at most
///       ⌈N·k/E·f⌉ rows of each source);
///   combine: all_to_allv of the rows received, 4·C·N·k bytes expected (uniform: as many
///       arrive as leave; bound: E·⌈N·k/E·f⌉ with a capacity, ep·N·k dropless).
/// Backward: dispatch and combine again (moe.cpp reuses the forward's exchanged counts). Of
/// each rank's rows, (ep−1)/ep leave it: N·k·(ep−1)/ep rows on the wire per direction.
struct EpLayerTraffic {
  double tokens = 0.0;          // N
  double rows_sent = 0.0;       // N·k (the dispatch's input rows)
  double rows_leaving = 0.0;    // N·k·(ep−1)/ep
  double rows_received = 0.0;   // expected, = rows_sent under uniform routing
  double rows_received_bound = 0.0;  // E·⌈N·k/E·f⌉ with a capacity; ep·N·k dropless
  double counts_bytes = 0.0;    // 4·E
  double dispatch_bytes = 0.0;  // 4·C·rows_sent
  double combine_bytes = 0.0;   // 4·C·rows_received
  double forward_bytes() const { return counts_bytes + dispatch_bytes + combine_bytes; }
  double backward_bytes() const { return dispatch_bytes + combine_bytes; }
};
EpLayerTraffic ep_layer_traffic(const Config& config);

/// ep bytes per step and rank: m · L_moe · (forward + backward), + a second forward under full
/// recompute (the block's forward, exchange included, runs again). 0 when ep = 1.
double ep_bytes_per_step(const Config& config, const ParameterCounts& stage_params);
/// Their time: formulas.h's all_to_all_s of each op's input on `link`. Seconds; 0 when ep = 1.
double ep_time_per_step(const Config& config, const ParameterCounts& stage_params,
                        const Link& link);
/// The formula as text, for --explain.
std::string ep_time_formula(const Config& config);

}  // namespace meshtrain::plan
