// src/meshtrain/parallel/pp/simulator.cpp
//
// Runs the ranks' lists as a dataflow: each rank advances through its list while it can; a
// compute action starts when the rank is free and takes its cost; a send posts at the rank's
// current time; a recv completes at max(rank time, post time of the matching send). Which
// rank is advanced first changes nothing (every time is a max over already fixed times), so
// "advance every rank as far as it goes, repeat until no rank moves" gives the timeline, and
// if some rank still has actions left then, they form the deadlock that is reported.
//
// A message is identified by (activation or gradient, micro-batch, global chunk it is sent
// TO, sender, receiver): send_activation of local chunk k on rank r carries F's output of
// global chunk g = k·p + r to g + 1; recv_activation of local chunk k on rank q is the input
// of global chunk k·p + q. Gradients run the other way.
#include "meshtrain/parallel/pp/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

namespace meshtrain::pp {
namespace {

// What is known about one (micro-batch, global chunk).
struct UnitState {
  std::optional<double> forward_end;
  std::optional<double> input_grad_end;  // fused backward or B done
  bool fused = false;
  bool weight_done = false;
  bool activation_received = false;  // the recv_activation for this F happened
  bool grad_received = false;        // the recv_grad for this backward happened
  bool activation_sent = false;
  bool grad_sent = false;
};

struct Message {
  double posted = 0.0;
  bool received = false;
  int rank = 0;  // sender
  Action action;
};

bool is_forward_pass(ActionKind k) {
  return k == ActionKind::forward || k == ActionKind::send_activation ||
         k == ActionKind::recv_activation;
}

using MessageKey =
    std::tuple<bool /*grad*/, int /*mb*/, int /*to chunk*/, int /*from*/, int /*to*/>;

class Simulation {
 public:
  Simulation(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
             const ActionCosts& costs)
      : p_(spec.pp),
        v_(spec.v),
        m_(spec.m),
        eval_(spec.pass == Pass::eval),
        lists_(lists),
        costs_(costs),
        next_(lists.size(), 0),
        clock_(lists.size(), 0.0),
        busy_(lists.size(), 0.0),
        alive_(lists.size(), 0) {
    result_.peak_in_flight.assign(lists.size(), 0);
    result_.timeline.resize(lists.size());
  }

  SimulationResult run() {
    if (!check_shape()) return std::move(result_);
    units_.resize(static_cast<std::size_t>(m_) * p_ * v_);
    bool moved = true;
    while (moved && !failed_) {
      moved = false;
      for (int r = 0; r < p_ && !failed_; ++r) {
        while (!failed_ && next_[r] < lists_[r].size() && step(r)) moved = true;
      }
    }
    if (failed_) return std::move(result_);
    if (!check_finished()) return std::move(result_);
    result_.makespan = *std::max_element(clock_.begin(), clock_.end());
    double idle = 0.0;
    for (int r = 0; r < p_; ++r) idle += result_.makespan - busy_[r];
    result_.bubble_fraction = result_.makespan > 0.0 ? idle / (p_ * result_.makespan) : 0.0;
    result_.ok = true;
    return std::move(result_);
  }

 private:
  int global(int rank, int chunk) const { return chunk * p_ + rank; }
  int rank_of(int g) const { return g % p_; }
  int last() const { return p_ * v_ - 1; }
  UnitState& unit(int mb, int g) { return units_[static_cast<std::size_t>(mb) * p_ * v_ + g]; }

  bool fail(int rank, const Action& a, const std::string& rule) {
    failed_ = true;
    result_.ok = false;
    result_.error = fmt::format("rank {}, action {} (#{} of its list): {}", rank, to_string(a),
                                next_[rank], rule);
    return false;
  }

  bool check_shape() {
    if (p_ < 1 || v_ < 1 || m_ < 1) {
      result_.error = fmt::format("spec pp = {}, v = {}, m = {}: each must be ≥ 1", p_, v_, m_);
      return false;
    }
    if (static_cast<int>(lists_.size()) != p_) {
      result_.error = fmt::format("{} action lists for pp = {} ranks", lists_.size(), p_);
      return false;
    }
    for (int r = 0; r < p_; ++r) {
      for (next_[r] = 0; next_[r] < lists_[r].size(); ++next_[r]) {
        const Action& a = lists_[r][next_[r]];
        if (a.microbatch < 0 || a.microbatch >= m_) {
          return fail(r, a, fmt::format("micro-batch outside [0, {})", m_));
        }
        if (a.chunk < 0 || a.chunk >= v_) {
          return fail(r, a, fmt::format("local chunk outside [0, {})", v_));
        }
        if (eval_ && !is_forward_pass(a.kind)) {
          return fail(r, a, "an evaluation (forward-only) list has no backward and no gradients");
        }
        const int g = global(r, a.chunk);
        int want = -1;
        std::string what = "a compute action has peer −1";
        switch (a.kind) {
          case ActionKind::send_activation:
            if (g == last()) return fail(r, a, "the last global chunk sends no activation");
            want = rank_of(g + 1);
            what = fmt::format("the activation of global chunk {} goes to rank {}", g, want);
            break;
          case ActionKind::recv_activation:
            if (g == 0) return fail(r, a, "global chunk 0 receives no activation");
            want = rank_of(g - 1);
            what = fmt::format("the input of global chunk {} comes from rank {}", g, want);
            break;
          case ActionKind::send_grad:
            if (g == 0) return fail(r, a, "global chunk 0 sends no gradient");
            want = rank_of(g - 1);
            what = fmt::format("the input gradient of global chunk {} goes to rank {}", g, want);
            break;
          case ActionKind::recv_grad:
            if (g == last()) return fail(r, a, "the last global chunk receives no gradient");
            want = rank_of(g + 1);
            what =
                fmt::format("the output gradient of global chunk {} comes from rank {}", g, want);
            break;
          default:
            break;
        }
        if (a.peer != want) return fail(r, a, fmt::format("wrong peer: {}", what));
      }
      next_[r] = 0;
    }
    return true;
  }

  MessageKey key_of_send(int rank, const Action& a) const {
    const int g = global(rank, a.chunk);
    const bool grad = a.kind == ActionKind::send_grad;
    return {grad, a.microbatch, grad ? g - 1 : g + 1, rank, a.peer};
  }
  MessageKey key_of_recv(int rank, const Action& a) const {
    return {a.kind == ActionKind::recv_grad, a.microbatch, global(rank, a.chunk), a.peer, rank};
  }

  void record(int rank, const Action& a, double start, double end) {
    result_.timeline[rank].push_back({a, start, end});
    clock_[rank] = end;
    ++next_[rank];
  }

  double cost(ActionKind k) const {
    switch (k) {
      case ActionKind::forward:
        return costs_.forward;
      case ActionKind::backward:
        return costs_.backward;
      case ActionKind::backward_input:
        return costs_.backward_input;
      case ActionKind::backward_weight:
        return costs_.backward_weight;
      default:
        return 0.0;
    }
  }

  // Executes the next action of `rank`; false if it must wait (a recv without its send) or
  // on a violation (failed_ set).
  bool step(int rank) {
    const Action& a = lists_[rank][next_[rank]];
    const int g = global(rank, a.chunk);
    UnitState& u = unit(a.microbatch, g);
    const double now = clock_[rank];
    switch (a.kind) {
      case ActionKind::send_activation:
      case ActionKind::send_grad: {
        const bool grad = a.kind == ActionKind::send_grad;
        if (!grad && !u.forward_end) return fail(rank, a, "send of an activation before its F");
        if (grad && !u.input_grad_end) {
          return fail(rank, a, "send of an input gradient before its backward");
        }
        bool& sent = grad ? u.grad_sent : u.activation_sent;
        if (sent) return fail(rank, a, "the same message is sent twice");
        sent = true;
        messages_[key_of_send(rank, a)] = Message{now, false, rank, a};
        record(rank, a, now, now);
        return true;
      }
      case ActionKind::recv_activation:
      case ActionKind::recv_grad: {
        auto it = messages_.find(key_of_recv(rank, a));
        if (it == messages_.end()) return false;  // waits (or deadlock, found later)
        if (it->second.received) return fail(rank, a, "the same message is received twice");
        it->second.received = true;
        (a.kind == ActionKind::recv_grad ? u.grad_received : u.activation_received) = true;
        record(rank, a, now, std::max(now, it->second.posted));
        return true;
      }
      case ActionKind::forward: {
        if (u.forward_end) return fail(rank, a, "duplicated F of this (micro-batch, chunk)");
        if (g > 0 && rank_of(g - 1) != rank && !u.activation_received) {
          return fail(rank, a, "F before the recv of its input activation");
        }
        if (g > 0 && !unit(a.microbatch, g - 1).forward_end) {
          return fail(rank, a, fmt::format("F before the F of global chunk {}", g - 1));
        }
        u.forward_end = now + costs_.forward;
        result_.peak_in_flight[rank] = std::max(result_.peak_in_flight[rank], alive_[rank] + 1);
        if (!eval_) ++alive_[rank];  // evaluation frees the activations when F ends
        break;
      }
      case ActionKind::backward:
      case ActionKind::backward_input: {
        if (u.input_grad_end) {
          return fail(rank, a, "a second backward of this (micro-batch, chunk)");
        }
        if (!u.forward_end) return fail(rank, a, "backward before the F of the same chunk");
        if (g < last() && rank_of(g + 1) != rank && !u.grad_received) {
          return fail(rank, a, "backward before the recv of its output gradient");
        }
        if (g < last() && !unit(a.microbatch, g + 1).input_grad_end) {
          return fail(rank, a,
                      fmt::format("backward before the backward of global chunk {}", g + 1));
        }
        u.fused = a.kind == ActionKind::backward;
        u.input_grad_end = now + cost(a.kind);
        if (u.fused) --alive_[rank];
        break;
      }
      case ActionKind::backward_weight: {
        if (u.weight_done) return fail(rank, a, "a second W of this (micro-batch, chunk)");
        if (!u.input_grad_end || u.fused) {
          return fail(rank, a, "W without a B (backward_input) of the same chunk before it");
        }
        u.weight_done = true;
        --alive_[rank];
        break;
      }
    }
    busy_[rank] += cost(a.kind);
    record(rank, a, now, now + cost(a.kind));
    return true;
  }

  bool check_finished() {
    std::string stuck;
    for (int r = 0; r < p_; ++r) {
      if (next_[r] < lists_[r].size()) {
        stuck += fmt::format("; rank {} waits at {} (#{}) for a send that never comes", r,
                             to_string(lists_[r][next_[r]]), next_[r]);
      }
    }
    if (!stuck.empty()) {
      result_.error = "deadlock: no rank can move" + stuck;
      return false;
    }
    for (const auto& [key, msg] : messages_) {
      if (!msg.received) {
        next_[msg.rank] = 0;
        for (const SimulatedAction& s : result_.timeline[msg.rank]) {
          if (s.action == msg.action) break;
          ++next_[msg.rank];
        }
        return fail(msg.rank, msg.action, "this send is never received (missing recv)");
      }
    }
    for (int i = 0; i < m_; ++i) {
      for (int g = 0; g <= last(); ++g) {
        const UnitState& u = unit(i, g);
        const char* missing = !u.forward_end               ? "F"
                              : eval_                      ? nullptr
                              : !u.input_grad_end          ? "backward"
                              : !u.fused && !u.weight_done ? "W"
                                                           : nullptr;
        if (missing != nullptr) {
          result_.error = fmt::format(
              "rank {}: micro-batch {}, local chunk {} (global {}) has no {} in the list",
              rank_of(g), i, g / p_, g, missing);
          return false;
        }
      }
    }
    return true;
  }

  int p_, v_, m_;
  bool eval_;  // Pass::eval: forwards only, nothing kept after a forward
  const std::vector<std::vector<Action>>& lists_;
  ActionCosts costs_;
  std::vector<UnitState> units_;
  std::vector<std::size_t> next_;
  std::vector<double> clock_, busy_;
  std::vector<int> alive_;
  std::map<MessageKey, Message> messages_;
  SimulationResult result_;
  bool failed_ = false;
};

}  // namespace

SimulationResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                          const ActionCosts& costs) {
  return Simulation(spec, lists, costs).run();
}

SimulationResult simulate(const ScheduleSpec& spec, const ActionCosts& costs) {
  std::vector<ConfigIssue> issues = check_schedule(spec);
  if (!issues.empty()) throw ConfigError("pipeline schedule", std::move(issues));
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < spec.pp; ++s) lists.push_back(schedule_for(spec, s));
  return simulate(spec, lists, costs);
}

std::string render_timeline(const SimulationResult& result, double unit) {
  const auto cell = [unit](double t) { return static_cast<std::size_t>(std::lround(t / unit)); };
  std::string out;
  for (std::size_t r = 0; r < result.timeline.size(); ++r) {
    std::string row(cell(result.makespan), '.');
    for (const SimulatedAction& s : result.timeline[r]) {
      char c = 0;
      switch (s.action.kind) {
        case ActionKind::forward:
          c = 'F';
          break;
        case ActionKind::backward:
        case ActionKind::backward_input:
          c = 'B';
          break;
        case ActionKind::backward_weight:
          c = 'W';
          break;
        default:
          continue;
      }
      for (std::size_t i = cell(s.start); i < cell(s.end) && i < row.size(); ++i) row[i] = c;
    }
    out += fmt::format("rank {} |{}|\n", r, row);
  }
  return out;
}

}  // namespace meshtrain::pp
