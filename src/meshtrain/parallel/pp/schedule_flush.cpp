// src/meshtrain/parallel/pp/schedule_flush.cpp
//
// The schedules with one model chunk per rank (v = 1) and a flush at the end of every step:
// stage s of p, micro-batches 0 … m−1, chunk 0. With unit costs (F = 1, fused backward = 2;
// split B = W = 1) the simulator proves the bubble fractions stated here (pipeline_schedule_test).
//
// gpipe (Huang et al. 2019): all m forwards in order, then all m fused backwards in REVERSE
//   order (m−1 first: the micro-batch the last stage finished last is the first whose gradient
//   is ready). Bubble (p−1)/(m+p−1); every micro-batch is alive at once: peak in flight m.
//
// 1f1b (PipeDream-flush, Narayanan et al. 2021 §2.2, Fig. 4 top): w = min(p−s−1, m) warm-up
//   forwards; then, for j = 0 … m−w−1, the steady pair F(w+j), BW(j); then the cool-down
//   BW(m−w) … BW(m−1). Bubble (p−1)/(m+p−1) (same as GPipe); peak in flight min(p−s, m).
//
// zb_h1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §3.1, handcrafted schedule H1):
//   the backward is split into B (input gradient, on the critical path) and W (weight
//   gradient, free to move). Rule implemented, stage s:
//     - the same w = min(p−s−1, m) warm-up forwards and the same F/B order as 1f1b: F(w+j)
//       then B(j) in the steady state, then the cool-down B's;
//     - W's run oldest first; right after each B, stage s runs W's while more than s
//       micro-batches have their B done and their W pending (stage s defers its W's by s
//       micro-batches); after the last B the remaining W's run back to back.
//   Stage 0 is 1f1b with a split backward (F B W); the last stage keeps p−1 W's pending, so
//   its B's — which gate everyone's cool-down — come p−1 W's earlier, and in the cool-down
//   stage s has s+1 W's after its last B, exactly the time its upstream stages still need for
//   their B chain. p = 4, m = 8, F = B = W = 1 (render_timeline; 1f1b on the right):
//     rank 0 |FFFF...BWFBWFBWFBWFBWBWBWBW|   rank 0 |FFFF......BBFBBFBBFBBFBB.BB.BB.BB|
//     rank 1 |.FFF..BFBWFBWFBWFBWFBWBWBWW|   rank 1 |.FFF....BBFBBFBBFBBFBBFBB.BB.BB..|
//     rank 2 |..FF.BFBFBWFBWFBWFBWFBWBWWW|   rank 2 |..FF..BBFBBFBBFBBFBBFBBFBB.BB....|
//     rank 3 |...FBFBFBFBWFBWFBWFBWFBWWWW|   rank 3 |...FBBFBBFBBFBBFBBFBBFBBFBB......|
//   Verified (pipeline_schedule_test): for m ≥ p the idle of every rank is
//   (p−1)(T_F + T_B − T_W), the paper's H1 bubble, whenever T_W ≤ min(T_F, T_B); with unit
//   costs the makespan is 3m + p − 1 and the bubble fraction (p−1)/(3m+p−1), a third of
//   1f1b's idle 3(p−1). For m < p the makespan is 2(m+p) − 1 (still below 1f1b's 3(m+p−1)).
//   Memory: a micro-batch is in flight from its F to its W, so every stage peaks at min(p, m)
//   — the peak of 1f1b's stage 0, and H1's promise: the maximum over ranks does not exceed
//   1f1b's. A per-stage bound p − s cannot coexist with this bubble: for the last stage's B of
//   micro-batch m−1 to leave the upstream chain time to finish by 3m + p − 1, it must still
//   have p W's to run at that moment (pending W's hold only what W needs, less than a whole
//   micro-batch's activations).
#include <algorithm>
#include <deque>

#include "meshtrain/parallel/pp/schedule_builder.h"

namespace meshtrain::pp::detail {

std::vector<Action> gpipe_schedule(const ScheduleSpec& spec, int stage) {
  ListBuilder list(spec.pp, 1, stage);
  for (int i = 0; i < spec.m; ++i) list.forward(i, 0);
  for (int i = spec.m - 1; i >= 0; --i) list.backward(i, 0);
  return list.take();
}

std::vector<Action> one_f_one_b_schedule(const ScheduleSpec& spec, int stage) {
  ListBuilder list(spec.pp, 1, stage);
  const int warmup = std::min(spec.pp - stage - 1, spec.m);
  for (int i = 0; i < warmup; ++i) list.forward(i, 0);
  for (int j = 0; j < spec.m - warmup; ++j) {
    list.forward(warmup + j, 0);
    list.backward(j, 0);
  }
  for (int j = spec.m - warmup; j < spec.m; ++j) list.backward(j, 0);
  return list.take();
}

std::vector<Action> zb_h1_schedule(const ScheduleSpec& spec, int stage) {
  ListBuilder list(spec.pp, 1, stage);
  const int warmup = std::min(spec.pp - stage - 1, spec.m);
  std::deque<int> pending_w;  // micro-batches whose B is done and W is not, oldest first
  auto input_backward = [&](int j) {
    list.backward(j, 0, ActionKind::backward_input);
    pending_w.push_back(j);
    while (static_cast<int>(pending_w.size()) > stage) {
      list.weight(pending_w.front(), 0);
      pending_w.pop_front();
    }
  };
  for (int i = 0; i < warmup; ++i) list.forward(i, 0);
  for (int j = 0; j < spec.m - warmup; ++j) {
    list.forward(warmup + j, 0);
    input_backward(j);
  }
  for (int j = spec.m - warmup; j < spec.m; ++j) input_backward(j);
  for (int i : pending_w) list.weight(i, 0);
  return list.take();
}

}  // namespace meshtrain::pp::detail
