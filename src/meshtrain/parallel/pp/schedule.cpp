// src/meshtrain/parallel/pp/schedule.cpp
//
// The rules every schedule spec obeys (check_schedule), the dispatch to the families
// (schedule_flush.cpp: gpipe, 1f1b, zb_h1; schedule_interleaved.cpp), the list builder that
// adds each compute's send/recv, and the text form of an action.
#include "meshtrain/parallel/pp/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "meshtrain/parallel/pp/schedule_builder.h"

namespace meshtrain::pp {
namespace {

constexpr std::array<std::string_view, 4> kNames = {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"};

bool known(std::string_view name) {
  for (std::string_view n : kNames) {
    if (n == name) return true;
  }
  return false;
}

}  // namespace

std::vector<ConfigIssue> check_schedule(const ScheduleSpec& spec) {
  std::vector<ConfigIssue> issues;
  auto add = [&](std::string setting, auto value, std::string rule, std::string fix) {
    issues.push_back(
        {std::move(setting), fmt::format("{}", value), std::move(rule), std::move(fix)});
  };
  const bool interleaved = spec.name == "interleaved_1f1b";
  if (!known(spec.name)) {
    add("parallel.pp_schedule", spec.name,
        "unknown pipeline schedule; the schedules are: gpipe, 1f1b, interleaved_1f1b, zb_h1",
        "set parallel.pp_schedule = \"1f1b\" (or gpipe, interleaved_1f1b, zb_h1)");
  }
  if (spec.pp < 1) {
    add("parallel.pp", spec.pp, "must be ≥ 1 (pipeline stages)",
        "use 1 for no pipeline parallelism");
  } else if (interleaved && spec.pp < 2) {
    add("parallel.pp", spec.pp,
        "interleaved_1f1b needs ≥ 2 stages: with one stage every chunk is on the same rank "
        "(each transfer would be to itself) and there is no bubble to shrink",
        "set parallel.pp ≥ 2, or parallel.pp_schedule = \"1f1b\" with "
        "parallel.virtual_stages = 1");
  }
  if (spec.v < 1) {
    add("parallel.virtual_stages", spec.v, "must be ≥ 1 (model chunks per pipeline rank)",
        interleaved ? "use 2 (or more) with interleaved_1f1b" : "use 1");
  } else if (interleaved && spec.v < 2) {
    add("parallel.virtual_stages", spec.v,
        "interleaved_1f1b needs ≥ 2 model chunks per rank (with 1 it is 1f1b)",
        "set parallel.virtual_stages = 2 (or more), or parallel.pp_schedule = \"1f1b\"");
  } else if (!interleaved && known(spec.name) && spec.v > 1) {
    add("parallel.virtual_stages", spec.v,
        fmt::format("only interleaved_1f1b runs more than one model chunk per rank; {} needs 1",
                    spec.name),
        "set parallel.virtual_stages = 1, or parallel.pp_schedule = \"interleaved_1f1b\"");
  }
  if (spec.m < 1) {
    add("parallel.microbatches", spec.m, "must be ≥ 1 (micro-batches per optimizer step)",
        fmt::format("use at least {} (parallel.pp; more micro-batches shrink the bubble)",
                    std::max(spec.pp, 1)));
  } else if (interleaved && spec.pp >= 2 && spec.m % spec.pp != 0) {
    const int lower = spec.m / spec.pp * spec.pp, upper = lower + spec.pp;
    add("parallel.microbatches", spec.m,
        fmt::format("interleaved_1f1b runs the micro-batches in groups of parallel.pp = {} "
                    "(Megatron-LM's rule): must be a multiple of {}",
                    spec.pp, spec.pp),
        lower >= spec.pp ? fmt::format("use {} or {} micro-batches", lower, upper)
                         : fmt::format("use {} micro-batches (or a multiple)", upper));
  }
  return issues;
}

std::vector<Action> schedule_for(const ScheduleSpec& spec, int stage) {
  std::vector<ConfigIssue> issues = check_schedule(spec);
  if (!issues.empty()) throw ConfigError("pipeline schedule", std::move(issues));
  MT_CHECK(stage >= 0 && stage < spec.pp, "schedule_for: stage {} is outside [0, {})", stage,
           spec.pp);
  if (spec.name == "gpipe") return detail::gpipe_schedule(spec, stage);
  if (spec.name == "1f1b") return detail::one_f_one_b_schedule(spec, stage);
  if (spec.name == "zb_h1") return detail::zb_h1_schedule(spec, stage);
  return detail::interleaved_1f1b_schedule(spec, stage);
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
