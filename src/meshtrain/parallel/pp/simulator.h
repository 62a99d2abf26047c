// src/meshtrain/parallel/pp/simulator.h
//
// Runs every rank's action list of a schedule together, in simulated time, before anything is
// allocated (DESIGN invariant 6). A rank executes its list in order; a compute action takes its
// cost; a send is posted at once (non-blocking, zero cost); a recv waits until the matching send
// (same kind, micro-batch and global chunk, from the expected peer) has been posted. Proves:
// every send meets exactly one recv and vice versa; F of (i, g) comes after F of (i, g − 1) and
// its recv, B after the F of the same (i, g) and after B of (i, g + 1), W after its B; each
// (micro-batch, chunk) has exactly one F and one backward (fused B, or B then W); no deadlock
// (when no rank can move, the simulation stops with the stuck actions of every rank). Under
// Pass::eval a list holds forwards and activation messages only, and each (micro-batch, chunk)
// needs exactly one F.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/parallel/pp/schedule.h"

namespace meshtrain::pp {

/// Time units per compute action. Defaults are "unit costs": F = B = W = 1, fused backward
/// B+W = 2 (so that 1F1B and GPipe have the textbook bubble (p−1)/(m+p−1)). Costs of one
/// chunk when v > 1 are divided by v by the caller if wanted.
struct ActionCosts {
  double forward = 1.0;
  double backward_input = 1.0;
  double backward_weight = 1.0;
  double backward = 2.0;  // fused B+W
};

struct SimulatedAction {
  Action action;
  double start = 0.0;
  double end = 0.0;
};

struct SimulationResult {
  bool ok = false;
  std::string error;  // why not ok: the violated rule, or the deadlock with each rank's next action
  double makespan = 0.0;
  /// Σ over ranks of idle time / (pp · makespan): idle = makespan − busy of that rank.
  double bubble_fraction = 0.0;
  /// Per rank: the most micro-batches (× chunks) alive at once — F started, last backward
  /// (fused B, or W) not finished; under Pass::eval one F's, so 1.
  std::vector<int> peak_in_flight;
  std::vector<std::vector<SimulatedAction>> timeline;  // per rank, in execution order
};

/// Simulates `lists` (one per pp rank, as schedule_for gives them) for the spec's pp, v, m.
SimulationResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                          const ActionCosts& costs = {});

/// schedule_for every stage, then simulate. Throws ConfigError as schedule_for does.
SimulationResult simulate(const ScheduleSpec& spec, const ActionCosts& costs = {});

/// A text chart of `result.timeline` for debugging: one line per rank, one character per
/// `unit` of time: F forward, B backward (fused or input), W weight gradient, '.' idle.
std::string render_timeline(const SimulationResult& result, double unit = 1.0);

}  // namespace meshtrain::pp
