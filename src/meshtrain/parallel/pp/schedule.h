// src/meshtrain/parallel/pp/schedule.h
//
// Pipeline schedules as data (DESIGN invariant 6): a schedule is a pure function of
// (pp, virtual stages v, micro-batches m, stage) returning that rank's ordered list of actions.
// The simulator (simulator.h) checks any schedule before it runs; one executor runs any of
// them; the same list, timed, is the timeline.
//
// Model chunks: the layers are cut into pp·v consecutive chunks; rank r holds chunks
// r, r + pp, …, r + (v−1)·pp (Megatron-LM's interleaved assignment, Narayanan et al. 2021,
// §2.2; v = 1 is the plain split). `Action::chunk` is the LOCAL index k ∈ [0, v) of global
// chunk k·pp + r. Activations flow from global chunk g to g + 1 (rank (g+1) mod pp), gradients
// back. The first global chunk holds the embedding, the last one the final norm, LM head and
// loss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain::pp {

enum class ActionKind : std::uint8_t {
  forward,          // F: forward of (microbatch, chunk); keeps its activations
  backward,         // B+W fused: input and weight gradients of (microbatch, chunk); frees them
  backward_input,   // B: input gradient only (zero-bubble schedules); keeps what W needs
  backward_weight,  // W: weight gradient of a (microbatch, chunk) whose B is done; frees it
  send_activation,  // to the rank holding global chunk + 1
  recv_activation,  // from the rank holding global chunk − 1 (input of F of `chunk`)
  send_grad,        // input gradient of `chunk` to the rank holding global chunk − 1
  recv_grad,        // output gradient of `chunk` from the rank holding global chunk + 1
};

struct Action {
  ActionKind kind;
  int microbatch;  // 0-based, [0, m)
  int chunk;       // local model chunk, [0, v)
  int peer;        // pp rank of the other side for send/recv; −1 for compute
  bool operator==(const Action&) const = default;
};

// What a list runs: a training step (forwards and backwards as the schedule `name` orders
// them), or an evaluation pass — forwards only, with their sends and recvs, over the same model
// chunks (eval_schedule below); no backward follows, so each activation can be freed as soon
// as its forward is done.
enum class Pass : std::uint8_t { train, eval };

struct ScheduleSpec {
  PipelineSchedule name = PipelineSchedule::one_f_one_b;  // parallel.pp_schedule
  int pp = 1;                                             // pipeline stages (ranks)
  int v = 1;  // model chunks per rank (virtual stages); > 1 only for interleaved_1f1b
  int m = 1;  // micro-batches per optimizer step (per evaluation batch under Pass::eval)
  Pass pass = Pass::train;
};

/// Every reason `spec` cannot run (pp/v/m < 1, v ≠ 1 for a non-interleaved
/// schedule; interleaved_1f1b needs v ≥ 2, pp ≥ 2 and m % pp == 0, hence m ≥ pp), each naming
/// the setting (parallel.pp_schedule, parallel.pp, parallel.virtual_stages,
/// training.accumulation, which is m), its value, the rule and a fix. Empty when valid.
std::vector<ConfigIssue> check_schedule(const ScheduleSpec& spec);

/// The ordered actions of pipeline rank `stage` ∈ [0, pp): the schedule `spec.name` under
/// Pass::train, eval_schedule under Pass::eval. Throws ConfigError when check_schedule(spec) is
/// not empty.
std::vector<Action> schedule_for(const ScheduleSpec& spec, int stage);

/// Forward-only (Pass::eval) actions of rank `stage`: for each local chunk k in order, F of
/// micro-batches 0 … m−1 (each with its recv before and send after), GPipe's forward half.
/// Deadlock-free for every pp, v, m: F(i, g) waits only for F(i, g − 1), which comes earlier
/// in the order (local chunk, micro-batch, rank) that every list follows. The last chunk runs
/// the micro-batches in order 0 … m−1, so its losses add up in micro-batch order. Nothing is
/// kept: peak in flight 1 (the runner frees a forward's activations when it ends).
std::vector<Action> eval_schedule(const ScheduleSpec& spec, int stage);

/// "F3.1" style text of one action (kind, micro-batch, chunk, peer), for errors and traces:
/// F forward, BW fused backward, B backward_input, W backward_weight, then micro-batch.chunk
/// (local chunk); sends and recvs add the peer: SA3.1>2 / RA3.1<0 (activation), SG / RG
/// (gradient).
std::string to_string(const Action& action);

}  // namespace meshtrain::pp
