// src/meshtrain/parallel/pp/schedule_builder.h
//
// Internal to parallel/pp: builds one rank's action list from compute steps, adding the
// send/recv actions each compute needs (recv immediately before the compute that consumes it,
// send immediately after the compute that produces it), and the schedule families that use it.
#pragma once

#include <utility>
#include <vector>

#include "meshtrain/parallel/pp/schedule.h"

namespace meshtrain::pp::detail {

class ListBuilder {
 public:
  ListBuilder(int pp, int v, int stage) : pp_(pp), v_(v), stage_(stage) {}

  /// recv_activation (unless global chunk 0), F, send_activation (unless the last chunk).
  void forward(int microbatch, int chunk);
  /// recv_grad (unless the last chunk), `kind` (backward or backward_input), send_grad (unless
  /// global chunk 0).
  void backward(int microbatch, int chunk, ActionKind kind = ActionKind::backward);
  /// W: no communication.
  void weight(int microbatch, int chunk);

  std::vector<Action> take() { return std::move(actions_); }

 private:
  int global(int chunk) const { return chunk * pp_ + stage_; }
  int next_rank() const { return (stage_ + 1) % pp_; }
  int prev_rank() const { return (stage_ + pp_ - 1) % pp_; }

  int pp_, v_, stage_;
  std::vector<Action> actions_;
};

// The families; `spec` is valid (check_schedule empty) and 0 ≤ stage < spec.pp.
std::vector<Action> gpipe_schedule(const ScheduleSpec& spec, int stage);
std::vector<Action> one_f_one_b_schedule(const ScheduleSpec& spec, int stage);
std::vector<Action> zb_h1_schedule(const ScheduleSpec& spec, int stage);
std::vector<Action> interleaved_1f1b_schedule(const ScheduleSpec& spec, int stage);

}  // namespace meshtrain::pp::detail
