// src/meshtrain/parallel/pp/schedule_interleaved.cpp
//
// interleaved_1f1b: Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, §2.2, Fig. 4
// bottom). Rank s holds v ≥ 2 chunks (local k = global k·p + s); m is a multiple of p.
//
// The rank runs m·v forward steps and m·v backward steps. Step n belongs to group n / (p·v);
// inside a group the rank runs p micro-batches through one chunk, then the same p through the
// next chunk:
//   micro-batch(n) = (n / (p·v))·p + n mod p,
//   chunk of forward step n  = (n mod (p·v)) / p,   chunk of backward step n = v − 1 − that.
// Warm-up: w = min((p − s − 1)·2 + (v − 1)·p, m·v) forward steps; steady state: forward step
// w + j then backward step j; cool-down: the remaining backward steps.
//
// With per-chunk costs F = 1/v and fused backward = 2/v (the whole model costs what it costs
// with v = 1) the simulator proves the bubble (p−1)/(v·m + p−1): the 1f1b bubble with the
// pipeline-fill time divided by v, for every m that is a multiple of p, m = p included
// (pipeline_schedule_test). Peak in flight on rank s, in (micro-batch, chunk) units:
// min(w + 1, m·v), the warm-up steps plus the one steady forward.
#include <algorithm>

#include "meshtrain/parallel/pp/schedule_builder.h"

namespace meshtrain::pp::detail {

std::vector<Action> interleaved_1f1b_schedule(const ScheduleSpec& spec, int stage) {
  const int p = spec.pp, v = spec.v, total = spec.m * v;
  ListBuilder list(p, v, stage);
  auto microbatch = [&](int n) { return n / (p * v) * p + n % p; };
  auto chunk = [&](int n) { return n % (p * v) / p; };
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  auto forward = [&](int n) { list.forward(microbatch(n), chunk(n)); };
  auto backward = [&](int n) { list.backward(microbatch(n), v - 1 - chunk(n)); };
  for (int n = 0; n < warmup; ++n) forward(n);
  for (int j = 0; j < total - warmup; ++j) {
    forward(warmup + j);
    backward(j);
  }
  for (int j = std::max(total - warmup, 0); j < total; ++j) backward(j);
  return list.take();
}

}  // namespace meshtrain::pp::detail
