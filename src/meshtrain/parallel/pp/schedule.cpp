// src/meshtrain/parallel/pp/schedule.cpp
//
// The rules every schedule spec obeys (check_schedule), the dispatch to the families
// (schedule_flush.cpp: gpipe, 1f1b, zb_h1; schedule_interleaved.cpp), the forward-only list of
// evaluation, the list builder that adds each compute's send/recv, and the text form of an
// action.
#include "meshtrain/parallel/pp/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "meshtrain/config/pipeline_rules.h"
#include "meshtrain/parallel/pp/schedule_builder.h"

namespace meshtrain::pp {

std::vector<ConfigIssue> check_schedule(const ScheduleSpec& spec) {
  return meshtrain::check_schedule(spec.name, spec.pp, spec.v, spec.m);
}

std::vector<Action> schedule_for(const ScheduleSpec& spec, int stage) {
  std::vector<ConfigIssue> issues = check_schedule(spec);
  if (!issues.empty()) throw ConfigError("pipeline schedule", std::move(issues));
  MT_CHECK(stage >= 0 && stage < spec.pp, "schedule_for: stage {} is outside [0, {})", stage,
           spec.pp);
  if (spec.pass == Pass::eval) return eval_schedule(spec, stage);
  switch (spec.name) {
    case PipelineSchedule::gpipe:
      return detail::gpipe_schedule(spec, stage);
    case PipelineSchedule::one_f_one_b:
      return detail::one_f_one_b_schedule(spec, stage);
    case PipelineSchedule::zb_h1:
      return detail::zb_h1_schedule(spec, stage);
    case PipelineSchedule::interleaved_1f1b:
      break;
  }
  return detail::interleaved_1f1b_schedule(spec, stage);
}

std::vector<Action> eval_schedule(const ScheduleSpec& spec, int stage) {
  detail::ListBuilder list(spec.pp, spec.v, stage);
  for (int chunk = 0; chunk < spec.v; ++chunk) {
    for (int i = 0; i < spec.m; ++i) list.forward(i, chunk);
  }
  return list.take();
}

std::string to_string(const Action& a) {
  // F forward, BW fused backward, B backward_input, W backward_weight; send/recv of
  // activations (SA/RA) and gradients (SG/RG) with ">peer" / "<peer".
  switch (a.kind) {
    case ActionKind::forward:
      return fmt::format("F{}.{}", a.microbatch, a.chunk);
    case ActionKind::backward:
      return fmt::format("BW{}.{}", a.microbatch, a.chunk);
    case ActionKind::backward_input:
      return fmt::format("B{}.{}", a.microbatch, a.chunk);
    case ActionKind::backward_weight:
      return fmt::format("W{}.{}", a.microbatch, a.chunk);
    case ActionKind::send_activation:
      return fmt::format("SA{}.{}>{}", a.microbatch, a.chunk, a.peer);
    case ActionKind::recv_activation:
      return fmt::format("RA{}.{}<{}", a.microbatch, a.chunk, a.peer);
    case ActionKind::send_grad:
      return fmt::format("SG{}.{}>{}", a.microbatch, a.chunk, a.peer);
    case ActionKind::recv_grad:
      return fmt::format("RG{}.{}<{}", a.microbatch, a.chunk, a.peer);
  }
  return fmt::format("?{}.{}", a.microbatch, a.chunk);
}

namespace detail {

void ListBuilder::forward(int microbatch, int chunk) {
  const int g = global(chunk);
  if (g > 0) actions_.push_back({ActionKind::recv_activation, microbatch, chunk, prev_rank()});
  actions_.push_back({ActionKind::forward, microbatch, chunk, -1});
  if (g < pp_ * v_ - 1) {
    actions_.push_back({ActionKind::send_activation, microbatch, chunk, next_rank()});
  }
}

void ListBuilder::backward(int microbatch, int chunk, ActionKind kind) {
  const int g = global(chunk);
  if (g < pp_ * v_ - 1) actions_.push_back({ActionKind::recv_grad, microbatch, chunk, next_rank()});
  actions_.push_back({kind, microbatch, chunk, -1});
  if (g > 0) actions_.push_back({ActionKind::send_grad, microbatch, chunk, prev_rank()});
}

void ListBuilder::weight(int microbatch, int chunk) {
  actions_.push_back({ActionKind::backward_weight, microbatch, chunk, -1});
}

}  // namespace detail
}  // namespace meshtrain::pp
