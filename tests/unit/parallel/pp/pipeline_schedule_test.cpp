// Tests of parallel/pp: the pipeline schedules (gpipe, 1f1b, interleaved_1f1b, zb_h1) as
// data, proved by the simulator over a table of (pp, v, m) — dependency order, one F and one
// backward per (micro-batch, chunk), exact bubble fractions and peak in-flight micro-batches —
// the simulator's own error detection, the forward-only schedule of evaluation (Pass::eval), and
// the spec rules' messages (DESIGN invariants 6, 9).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/parallel/pp/schedule.h"
#include "meshtrain/parallel/pp/simulator.h"

namespace meshtrain::pp {
namespace {

using Lists = std::vector<std::vector<Action>>;

// `text` contains `part`; prints the whole text otherwise.
#define EXPECT_HAS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

Lists lists_of(const ScheduleSpec& spec) {
  Lists lists;
  for (int s = 0; s < spec.pp; ++s) lists.push_back(schedule_for(spec, s));
  return lists;
}

std::string text_of(const std::vector<Action>& list) {
  std::string out;
  for (const Action& a : list) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

// Every valid spec of the table: pp 1–8, m 1–32, v 1–3.
std::vector<ScheduleSpec> table() {
  std::vector<ScheduleSpec> specs;
  for (const auto& [name, text, what] : kPipelineScheduleNames) {
    for (int pp = 1; pp <= 8; ++pp) {
      for (int v = 1; v <= 3; ++v) {
        for (int m = 1; m <= 32; ++m) {
          ScheduleSpec spec{name, pp, v, m};
          if (check_schedule(spec).empty()) specs.push_back(spec);
        }
      }
    }
  }
  return specs;
}

std::string label(const ScheduleSpec& s) {
  return std::string(to_string(s.name)) + " pp=" + std::to_string(s.pp) + " v=" + std::to_string(s.v) +
         " m=" + std::to_string(s.m);
}

// Unit costs of the whole model: one chunk of v costs 1/v of F = 1, fused backward = 2.
ActionCosts chunk_costs(int v) {
  ActionCosts c;
  c.forward = 1.0 / v;
  c.backward = 2.0 / v;
  return c;
}

bool is_backward(ActionKind k) {
  return k == ActionKind::backward || k == ActionKind::backward_input;
}

TEST(PipelineSchedule, ToStringFormat) {
  EXPECT_EQ(to_string({ActionKind::forward, 3, 1, -1}), "F3.1");
  EXPECT_EQ(to_string({ActionKind::backward, 3, 1, -1}), "BW3.1");
  EXPECT_EQ(to_string({ActionKind::backward_input, 0, 2, -1}), "B0.2");
  EXPECT_EQ(to_string({ActionKind::backward_weight, 12, 0, -1}), "W12.0");
  EXPECT_EQ(to_string({ActionKind::send_activation, 3, 1, 2}), "SA3.1>2");
  EXPECT_EQ(to_string({ActionKind::recv_activation, 3, 1, 0}), "RA3.1<0");
  EXPECT_EQ(to_string({ActionKind::send_grad, 4, 0, 1}), "SG4.0>1");
  EXPECT_EQ(to_string({ActionKind::recv_grad, 4, 0, 3}), "RG4.0<3");
}

TEST(PipelineSchedule, ListsOfSmallPipelines) {
  EXPECT_EQ(text_of(schedule_for({PipelineSchedule::gpipe, 2, 1, 2}, 0)),
            "F0.0 SA0.0>1 F1.0 SA1.0>1 RG1.0<1 BW1.0 RG0.0<1 BW0.0");
  EXPECT_EQ(text_of(schedule_for({PipelineSchedule::one_f_one_b, 2, 1, 3}, 0)),
            "F0.0 SA0.0>1 F1.0 SA1.0>1 RG0.0<1 BW0.0 F2.0 SA2.0>1 RG1.0<1 BW1.0 RG2.0<1 BW2.0");
  EXPECT_EQ(text_of(schedule_for({PipelineSchedule::one_f_one_b, 2, 1, 3}, 1)),
            "RA0.0<0 F0.0 BW0.0 SG0.0>0 RA1.0<0 F1.0 BW1.0 SG1.0>0 RA2.0<0 F2.0 BW2.0 SG2.0>0");
  // zb_h1: stage 0 runs W right after B, stage 1 keeps one W pending.
  EXPECT_EQ(text_of(schedule_for({PipelineSchedule::zb_h1, 2, 1, 3}, 0)),
            "F0.0 SA0.0>1 F1.0 SA1.0>1 RG0.0<1 B0.0 W0.0 F2.0 SA2.0>1 RG1.0<1 B1.0 W1.0 RG2.0<1 "
            "B2.0 W2.0");
  EXPECT_EQ(text_of(schedule_for({PipelineSchedule::zb_h1, 2, 1, 3}, 1)),
            "RA0.0<0 F0.0 B0.0 SG0.0>0 RA1.0<0 F1.0 B1.0 SG1.0>0 W0.0 RA2.0<0 F2.0 B2.0 SG2.0>0 "
            "W1.0 W2.0");
  // interleaved, pp = 2, v = 2, m = 4: rank 1 holds global chunks 1 and 3; groups of pp = 2
  // micro-batches per chunk; 2 warm-up forward steps on rank 1 ((v − 1)·pp).
  EXPECT_EQ(text_of(schedule_for({PipelineSchedule::interleaved_1f1b, 2, 2, 4}, 1)),
            "RA0.0<0 F0.0 SA0.0>0 RA1.0<0 F1.0 SA1.0>0 RA0.1<0 F0.1 BW0.1 SG0.1>0 RA1.1<0 F1.1 "
            "BW1.1 SG1.1>0 RA2.0<0 F2.0 SA2.0>0 RG0.0<0 BW0.0 SG0.0>0 RA3.0<0 F3.0 SA3.0>0 "
            "RG1.0<0 BW1.0 SG1.0>0 RA2.1<0 F2.1 BW2.1 SG2.1>0 RA3.1<0 F3.1 BW3.1 SG3.1>0 RG2.0<0 "
            "BW2.0 SG2.0>0 RG3.0<0 BW3.0 SG3.0>0");
}

// Over the whole table: the simulation succeeds; on its rank every (micro-batch, local chunk)
// has exactly one F, then one backward (B then W for zb_h1, fused otherwise); every recv is
// right before the compute that consumes it and every send right after the one that produces it.
TEST(PipelineSchedule, EveryValidSpecSimulatesWithOneForwardAndBackwardPerChunk) {
  const std::vector<ScheduleSpec> specs = table();
  ASSERT_EQ(specs.size(), 3u * 8 * 32 + 106);  // gpipe, 1f1b, zb_h1; interleaved
  for (const ScheduleSpec& spec : specs) {
    SCOPED_TRACE(label(spec));
    const bool split = spec.name == PipelineSchedule::zb_h1;
    const Lists lists = lists_of(spec);
    const SimulationResult r = simulate(spec, lists, chunk_costs(spec.v));
    ASSERT_TRUE(r.ok) << r.error;
    for (int s = 0; s < spec.pp; ++s) {
      const std::vector<Action>& list = lists[s];
      ASSERT_EQ(r.timeline[s].size(), list.size());
      std::map<std::pair<int, int>, std::string> seen;  // (mb, chunk) → compute letters so far
      for (std::size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        const std::string& done = seen[{a.microbatch, a.chunk}];
        switch (a.kind) {
          case ActionKind::forward:
            ASSERT_EQ(done, "") << "rank " << s << ": " << to_string(a);
            seen[{a.microbatch, a.chunk}] = "F";
            break;
          case ActionKind::backward:
            ASSERT_FALSE(split);
            ASSERT_EQ(done, "F") << "rank " << s << ": " << to_string(a);
            seen[{a.microbatch, a.chunk}] = "FBW";
            break;
          case ActionKind::backward_input:
            ASSERT_TRUE(split);
            ASSERT_EQ(done, "F") << "rank " << s << ": " << to_string(a);
            seen[{a.microbatch, a.chunk}] = "FB";
            break;
          case ActionKind::backward_weight:
            ASSERT_EQ(done, "FB") << "rank " << s << ": " << to_string(a);
            seen[{a.microbatch, a.chunk}] = "FBW";
            break;
          case ActionKind::recv_activation:
          case ActionKind::recv_grad: {
            ASSERT_LT(i + 1, list.size());
            const Action& next = list[i + 1];
            const bool fwd = a.kind == ActionKind::recv_activation;
            EXPECT_TRUE(fwd ? next.kind == ActionKind::forward : is_backward(next.kind))
                << "rank " << s << ": " << to_string(a) << " then " << to_string(next);
            EXPECT_EQ(std::make_pair(next.microbatch, next.chunk),
                      std::make_pair(a.microbatch, a.chunk));
            break;
          }
          case ActionKind::send_activation:
          case ActionKind::send_grad: {
            ASSERT_GT(i, 0u);
            const Action& prev = list[i - 1];
            const bool fwd = a.kind == ActionKind::send_activation;
            EXPECT_TRUE(fwd ? prev.kind == ActionKind::forward : is_backward(prev.kind))
                << "rank " << s << ": " << to_string(prev) << " then " << to_string(a);
            EXPECT_EQ(std::make_pair(prev.microbatch, prev.chunk),
                      std::make_pair(a.microbatch, a.chunk));
            break;
          }
        }
      }
      ASSERT_EQ(seen.size(), static_cast<std::size_t>(spec.m * spec.v));
      for (const auto& [unit, done] : seen) {
        EXPECT_EQ(done, "FBW") << "rank " << s << ", micro-batch " << unit.first << ", chunk "
                               << unit.second;
      }
    }
  }
}

// GPipe and 1F1B with F = 1, fused B+W = 2: makespan 3(m+p−1), bubble (p−1)/(m+p−1), for
// every pp 1–8 and m 1–32 (m < pp included). Both orders reach the textbook value; they differ
// in memory (PipelineSchedule.PeakInFlight), not in time.
TEST(PipelineSchedule, GPipeAndOneFOneBBubbleIsTextbookFormula) {
  int checked = 0;
  for (const ScheduleSpec& spec : table()) {
    if (spec.name != PipelineSchedule::gpipe && spec.name != PipelineSchedule::one_f_one_b)
      continue;
    SCOPED_TRACE(label(spec));
    const SimulationResult r = simulate(spec);
    ASSERT_TRUE(r.ok) << r.error;
    const double p = spec.pp, m = spec.m;
    EXPECT_DOUBLE_EQ(r.makespan, 3 * (m + p - 1));
    EXPECT_NEAR(r.bubble_fraction, (p - 1) / (m + p - 1), 1e-12);
    ++checked;
  }
  EXPECT_EQ(checked, 2 * 8 * 32);
}

// Interleaved, per-chunk costs F = 1/v, fused backward = 2/v: makespan 3m + 3(p−1)/v and
// bubble (p−1)/(v·m+p−1) for every pp 2–8, v 2–3, m a multiple of pp up to 32 (m = pp
// included: the fill is divided by v as the paper states).
TEST(PipelineSchedule, InterleavedBubbleShrinksByV) {
  int checked = 0;
  for (const ScheduleSpec& spec : table()) {
    if (spec.name != PipelineSchedule::interleaved_1f1b) continue;
    SCOPED_TRACE(label(spec));
    const SimulationResult r = simulate(spec, chunk_costs(spec.v));
    ASSERT_TRUE(r.ok) << r.error;
    const double p = spec.pp, m = spec.m, v = spec.v;
    EXPECT_NEAR(r.makespan, 3 * m + 3 * (p - 1) / v, 1e-9);
    EXPECT_NEAR(r.bubble_fraction, (p - 1) / (v * m + p - 1), 1e-12);
    const SimulationResult flat = simulate({PipelineSchedule::one_f_one_b, spec.pp, 1, spec.m});
    EXPECT_LT(r.bubble_fraction, flat.bubble_fraction);
    ++checked;
  }
  EXPECT_EQ(checked, 2 * (16 + 10 + 8 + 6 + 5 + 4 + 4));  // v ∈ {2, 3}, pp = 2 … 8
}

// ZB-H1 with F = B = W = 1 (1F1B's fused backward = 2): makespan 3m + p − 1 when m ≥ p, i.e.
// idle (p−1)(T_F + T_B − T_W) = p − 1 per rank and bubble (p−1)/(3m+p−1) — a third of 1F1B's
// idle 3(p−1). With m < p: makespan 2(m+p) − 1. Strictly below 1F1B for every pp ≥ 2.
TEST(PipelineSchedule, ZbH1BubbleIsTheH1Formula) {
  for (const ScheduleSpec& spec : table()) {
    if (spec.name != PipelineSchedule::zb_h1) continue;
    SCOPED_TRACE(label(spec));
    const SimulationResult r = simulate(spec);
    ASSERT_TRUE(r.ok) << r.error;
    const double p = spec.pp, m = spec.m;
    const double makespan = spec.m >= spec.pp ? 3 * m + p - 1 : 2 * (m + p) - 1;
    EXPECT_DOUBLE_EQ(r.makespan, makespan);
    EXPECT_NEAR(r.bubble_fraction, (makespan - 3 * m) / makespan, 1e-12);
    if (spec.m >= spec.pp) {
      EXPECT_NEAR(r.bubble_fraction, (p - 1) / (3 * m + p - 1), 1e-12);
    }
    const SimulationResult flat = simulate({PipelineSchedule::one_f_one_b, spec.pp, 1, spec.m});
    if (spec.pp >= 2) {
      EXPECT_LT(r.bubble_fraction, flat.bubble_fraction);
    } else {
      EXPECT_EQ(r.bubble_fraction, 0.0);
    }
  }
}

// The paper's H1 bubble (p−1)(T_F + T_B − T_W) per rank holds for other costs too, as long as
// T_W ≤ min(T_F, T_B) (a longer W cannot hide in the gaps this rule leaves for it).
TEST(PipelineSchedule, ZbH1IdleIsPaperFormulaWhenWIsShortest) {
  struct Costs {
    double f, b, w;
  };
  for (const Costs c : {Costs{1, 1, 1}, Costs{2, 2, 1}, Costs{1, 2, 1}, Costs{2, 1, 1},
                        Costs{1.5, 1, 0.5}, Costs{3, 5, 2}}) {
    ActionCosts costs;
    costs.forward = c.f;
    costs.backward_input = c.b;
    costs.backward_weight = c.w;
    for (int pp = 2; pp <= 8; ++pp) {
      for (int m = pp; m <= 32; ++m) {
        SCOPED_TRACE(::testing::Message()
                     << "F=" << c.f << " B=" << c.b << " W=" << c.w << " pp=" << pp << " m=" << m);
        const SimulationResult r = simulate({PipelineSchedule::zb_h1, pp, 1, m}, costs);
        ASSERT_TRUE(r.ok) << r.error;
        EXPECT_NEAR(r.makespan - m * (c.f + c.b + c.w), (pp - 1) * (c.f + c.b - c.w), 1e-9);
      }
    }
  }
}

// Peak micro-batches (× chunks) in flight per rank, F started to last backward finished:
//   gpipe m; 1f1b min(p − s, m); zb_h1 min(p, m) on EVERY rank (a micro-batch stays in flight
//   until its W, and stage s defers W's by s) — the max over ranks equals 1f1b's (its stage 0);
//   interleaved min(2(p − s − 1) + (v − 1)·p + 1, v·m) (warm-up steps + 1).
TEST(PipelineSchedule, PeakInFlight) {
  for (const ScheduleSpec& spec : table()) {
    SCOPED_TRACE(label(spec));
    const SimulationResult r = simulate(spec, chunk_costs(spec.v));
    ASSERT_TRUE(r.ok) << r.error;
    ASSERT_EQ(r.peak_in_flight.size(), static_cast<std::size_t>(spec.pp));
    const int p = spec.pp, m = spec.m, v = spec.v;
    for (int s = 0; s < p; ++s) {
      int expected = 0;
      if (spec.name == PipelineSchedule::gpipe) expected = m;
      if (spec.name == PipelineSchedule::one_f_one_b) expected = std::min(p - s, m);
      if (spec.name == PipelineSchedule::zb_h1) expected = std::min(p, m);
      if (spec.name == PipelineSchedule::interleaved_1f1b)
        expected = std::min(2 * (p - s - 1) + (v - 1) * p + 1, v * m);
      EXPECT_EQ(r.peak_in_flight[s], expected) << "rank " << s;
    }
    if (spec.name == PipelineSchedule::zb_h1) {
      const SimulationResult flat = simulate({PipelineSchedule::one_f_one_b, p, 1, m});
      EXPECT_EQ(*std::max_element(r.peak_in_flight.begin(), r.peak_in_flight.end()),
                *std::max_element(flat.peak_in_flight.begin(), flat.peak_in_flight.end()));
    }
  }
}

// Evaluation's forward-only lists (Pass::eval) over the whole table: the simulation completes
// without deadlock; every (micro-batch, local chunk) has exactly one F and nothing else runs;
// each rank's F come in (local chunk, micro-batch) order, so the model's last chunk computes
// the losses in micro-batch order (the val loss adds them in the order evaluation always did);
// and nothing is kept after a forward (peak in flight 1).
TEST(PipelineSchedule, EvalScheduleRunsEveryForwardOnceInOrder) {
  for (ScheduleSpec spec : table()) {
    spec.pass = Pass::eval;
    SCOPED_TRACE(label(spec) + " eval");
    const Lists lists = lists_of(spec);
    const SimulationResult r = simulate(spec, lists, chunk_costs(spec.v));
    ASSERT_TRUE(r.ok) << r.error;
    for (int s = 0; s < spec.pp; ++s) {
      std::vector<std::pair<int, int>> order;  // (chunk, micro-batch) of each F
      for (const Action& a : lists[s]) {
        ASSERT_TRUE(a.kind == ActionKind::forward || a.kind == ActionKind::send_activation ||
                    a.kind == ActionKind::recv_activation)
            << "rank " << s << ": " << to_string(a);
        if (a.kind == ActionKind::forward) order.emplace_back(a.chunk, a.microbatch);
      }
      std::vector<std::pair<int, int>> expected;
      for (int k = 0; k < spec.v; ++k) {
        for (int i = 0; i < spec.m; ++i) expected.emplace_back(k, i);
      }
      EXPECT_EQ(order, expected) << "rank " << s;
      EXPECT_EQ(r.peak_in_flight[s], 1) << "rank " << s;
    }
  }
}

TEST(PipelineSchedule, EvalListsOfSmallPipelines) {
  const ScheduleSpec two{
      .name = PipelineSchedule::one_f_one_b, .pp = 2, .v = 1, .m = 2, .pass = Pass::eval};
  EXPECT_EQ(text_of(schedule_for(two, 0)), "F0.0 SA0.0>1 F1.0 SA1.0>1");
  EXPECT_EQ(text_of(schedule_for(two, 1)), "RA0.0<0 F0.0 RA1.0<0 F1.0");
  // Interleaved, pp = 2, v = 2: rank 0 holds global chunks 0 and 2, so its second chunk waits
  // for rank 1's first.
  const ScheduleSpec v2{
      .name = PipelineSchedule::interleaved_1f1b, .pp = 2, .v = 2, .m = 2, .pass = Pass::eval};
  EXPECT_EQ(text_of(schedule_for(v2, 0)),
            "F0.0 SA0.0>1 F1.0 SA1.0>1 RA0.1<1 F0.1 SA0.1>1 RA1.1<1 F1.1 SA1.1>1");
  EXPECT_EQ(text_of(schedule_for(v2, 1)),
            "RA0.0<0 F0.0 SA0.0>0 RA1.0<0 F1.0 SA1.0>0 RA0.1<0 F0.1 RA1.1<0 F1.1");
}

TEST(PipelineSimulator, EvalListWithABackwardOrAMissingForwardIsRejected) {
  const ScheduleSpec spec{
      .name = PipelineSchedule::one_f_one_b, .pp = 2, .v = 1, .m = 2, .pass = Pass::eval};
  Lists with_backward = lists_of(spec);
  with_backward[1].push_back({ActionKind::backward, 0, 0, -1});
  const SimulationResult r = simulate(spec, with_backward);
  EXPECT_FALSE(r.ok);
  EXPECT_HAS(r.error, "rank 1, action BW0.0");
  EXPECT_HAS(r.error, "no backward");
  Lists missing = lists_of(spec);
  missing[1].resize(2);  // RA0.0 F0.0: micro-batch 1 never reaches the last stage
  missing[0].resize(2);  // F0.0 SA0.0
  const SimulationResult m = simulate(spec, missing);
  EXPECT_FALSE(m.ok);
  EXPECT_HAS(m.error, "micro-batch 1");
  EXPECT_HAS(m.error, "has no F");
}

TEST(PipelineSimulator, TimelineOfOneFOneB) {
  const SimulationResult r = simulate({PipelineSchedule::one_f_one_b, 2, 1, 2});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(render_timeline(r), "rank 0 |FF..BB.BB|\nrank 1 |.FBBFBB..|\n");
  ASSERT_EQ(r.timeline[1].size(), 8u);
  EXPECT_EQ(to_string(r.timeline[1][0].action), "RA0.0<0");
  EXPECT_EQ(r.timeline[1][0].end, 1.0);  // waited for rank 0's F0.0
  const SimulationResult zb = simulate({PipelineSchedule::zb_h1, 3, 1, 4});
  ASSERT_TRUE(zb.ok) << zb.error;
  EXPECT_EQ(render_timeline(zb),
            "rank 0 |FFF..BWFBWBWBW|\n"
            "rank 1 |.FF.BFBWFBWBWW|\n"
            "rank 2 |..FBFBFBWFBWWW|\n");
}

// --- the simulator finds broken lists ---------------------------------------------------

// Runs `lists` for (pp, m) with v = 1 and returns the error; fails the test if it was ok.
std::string error_of(int pp, int m, const Lists& lists) {
  const SimulationResult r = simulate({PipelineSchedule::one_f_one_b, pp, 1, m}, lists);
  EXPECT_FALSE(r.ok);
  return r.error;
}

void erase_action(std::vector<Action>& list, const std::string& text) {
  auto it =
      std::find_if(list.begin(), list.end(), [&](const Action& a) { return to_string(a) == text; });
  ASSERT_NE(it, list.end()) << text;
  list.erase(it);
}

TEST(PipelineSimulator, DetectsDeadlockWhenBothRanksRecvFirst) {
  const Lists lists = {
      {{ActionKind::recv_grad, 0, 0, 1},
       {ActionKind::forward, 0, 0, -1},
       {ActionKind::send_activation, 0, 0, 1},
       {ActionKind::backward, 0, 0, -1}},
      {{ActionKind::recv_activation, 0, 0, 0},
       {ActionKind::forward, 0, 0, -1},
       {ActionKind::backward, 0, 0, -1},
       {ActionKind::send_grad, 0, 0, 0}},
  };
  const std::string error = error_of(2, 1, lists);
  EXPECT_HAS(error, "deadlock");
  EXPECT_HAS(error, "rank 0 waits at RG0.0<1");
  EXPECT_HAS(error, "rank 1 waits at RA0.0<0");
}

TEST(PipelineSimulator, DetectsMissingRecv) {
  Lists lists = lists_of({PipelineSchedule::one_f_one_b, 2, 1, 2});
  erase_action(lists[1], "RA1.0<0");
  const std::string error = error_of(2, 2, lists);
  EXPECT_HAS(error, "rank 1, action F1.0");
  EXPECT_HAS(error, "F before the recv of its input activation");

  // A send nobody receives (rank 0 lost both the recv and the backward that needs it).
  lists = lists_of({PipelineSchedule::one_f_one_b, 2, 1, 2});
  erase_action(lists[0], "RG1.0<1");
  erase_action(lists[0], "BW1.0");
  EXPECT_HAS(error_of(2, 2, lists), "rank 1, action SG1.0>0");
  EXPECT_HAS(error_of(2, 2, lists), "never received (missing recv)");
}

TEST(PipelineSimulator, DetectsDuplicatedForward) {
  Lists lists = lists_of({PipelineSchedule::gpipe, 3, 1, 2});
  lists[2].insert(lists[2].begin() + 2, Action{ActionKind::forward, 0, 0, -1});
  const std::string error = error_of(3, 2, lists);
  EXPECT_HAS(error, "rank 2, action F0.0 (#2 of its list)");
  EXPECT_HAS(error, "duplicated F");
}

TEST(PipelineSimulator, DetectsBackwardBeforeForward) {
  Lists lists = lists_of({PipelineSchedule::one_f_one_b, 2, 1, 2});
  // Rank 1 (last stage, needs no gradient): BW1.0 moved in front of its F1.0.
  erase_action(lists[1], "BW1.0");
  auto f1 = std::find(lists[1].begin(), lists[1].end(), Action{ActionKind::forward, 1, 0, -1});
  lists[1].insert(f1, Action{ActionKind::backward, 1, 0, -1});
  const std::string error = error_of(2, 2, lists);
  EXPECT_HAS(error, "rank 1, action BW1.0");
  EXPECT_HAS(error, "backward before the F of the same chunk");
}

TEST(PipelineSimulator, DetectsWrongPeerMissingWeightAndSendBeforeCompute) {
  Lists lists = lists_of({PipelineSchedule::one_f_one_b, 3, 1, 1});
  lists[0][1].peer = 2;  // SA0.0 to rank 2 instead of rank 1
  EXPECT_HAS(error_of(3, 1, lists), ("wrong peer: the activation of global chunk 0 goes to "
                                     "rank 1"));

  lists = lists_of({PipelineSchedule::zb_h1, 2, 1, 2});
  erase_action(lists[1], "W1.0");
  EXPECT_HAS(error_of(2, 2, lists), "micro-batch 1, local chunk 0 (global 1) has no W");

  lists = lists_of({PipelineSchedule::one_f_one_b, 2, 1, 1});
  std::swap(lists[0][0], lists[0][1]);  // SA0.0 before F0.0
  EXPECT_HAS(error_of(2, 1, lists), "send of an activation before its F");
}

// --- spec rules ------------------------------------------------------------------------

struct BadSpec {
  ScheduleSpec spec;
  const char* setting;
  const char* value;
  const char* rule_part;
  const char* fix_part;
};

TEST(PipelineSchedule, CheckScheduleNamesSettingValueRuleAndFix) {
  const BadSpec cases[] = {
      {{PipelineSchedule::one_f_one_b, 0, 1, 4}, "parallel.pp", "0", "must be ≥ 1", "use 1"},
      {{PipelineSchedule::gpipe, 2, 1, 0}, "training.accumulation", "0", "must be ≥ 1", "at least"},
      {{PipelineSchedule::zb_h1, 2, 0, 4}, "parallel.virtual_stages", "0", "must be ≥ 1", "use 1"},
      {{PipelineSchedule::one_f_one_b, 2, 2, 4},
       "parallel.virtual_stages",
       "2",
       "only interleaved_1f1b",
       "parallel.virtual_stages = 1"},
      {{PipelineSchedule::zb_h1, 4, 3, 8},
       "parallel.virtual_stages",
       "3",
       "zb_h1 needs 1",
       "interleaved_1f1b"},
      {{PipelineSchedule::interleaved_1f1b, 2, 1, 4},
       "parallel.virtual_stages",
       "1",
       "≥ 2 model chunks",
       "parallel.virtual_stages = 2"},
      {{PipelineSchedule::interleaved_1f1b, 1, 2, 4},
       "parallel.pp",
       "1",
       "needs ≥ 2 stages",
       "parallel.pp ≥ 2"},
      {{PipelineSchedule::interleaved_1f1b, 4, 2, 6},
       "training.accumulation",
       "6",
       "must be a multiple of 4",
       "set training.accumulation to 4 or 8"},
      {{PipelineSchedule::interleaved_1f1b, 4, 2, 2},
       "training.accumulation",
       "2",
       "groups of parallel.pp = 4",
       "set training.accumulation to 4"},
  };
  for (const BadSpec& c : cases) {
    SCOPED_TRACE(label(c.spec));
    const std::vector<ConfigIssue> issues = check_schedule(c.spec);
    ASSERT_EQ(issues.size(), 1u) << format_config_issues("test", issues);
    EXPECT_EQ(issues[0].setting, c.setting);
    EXPECT_EQ(issues[0].value, c.value);
    EXPECT_HAS(issues[0].rule, c.rule_part);
    EXPECT_HAS(issues[0].fix, c.fix_part);
    try {
      schedule_for(c.spec, 0);
      ADD_FAILURE() << "expected ConfigError";
    } catch (const ConfigError& e) {
      ASSERT_EQ(e.issues().size(), 1u);
      EXPECT_EQ(e.issues()[0].setting, c.setting);
    }
    EXPECT_THROW(simulate(c.spec), ConfigError);
  }
  // Everything wrong at once: every issue is reported. (An unknown schedule name cannot reach
  // a ScheduleSpec: it is a config error when loaded, config_test's BadEnumNames...)
  const std::vector<ConfigIssue> all = check_schedule({PipelineSchedule::gpipe, 0, 0, 0});
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].setting, "parallel.pp");
  EXPECT_EQ(all[1].setting, "parallel.virtual_stages");
  EXPECT_EQ(all[2].setting, "training.accumulation");
  // The valid corners.
  EXPECT_TRUE(check_schedule({PipelineSchedule::gpipe, 1, 1, 1}).empty());
  EXPECT_TRUE(check_schedule({PipelineSchedule::one_f_one_b, 8, 1, 1}).empty());
  EXPECT_TRUE(check_schedule({PipelineSchedule::zb_h1, 8, 1, 3}).empty());
  EXPECT_TRUE(check_schedule({PipelineSchedule::interleaved_1f1b, 2, 2, 2}).empty());
}

}  // namespace
}  // namespace meshtrain::pp
