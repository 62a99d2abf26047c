// tests/support/training_run.h — what the equivalence tests record from a Trainer and how they
// compare tensors: losses of every step, step 1's gradients (gathered to logical tensors, so
// any tp layout compares with tp = 1) and grad norm, and max-abs error helpers.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshtrain/parallel/tp/gather.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::test {

inline TrainerOptions quiet() {
  TrainerOptions o;
  o.log = false;
  return o;
}

struct TrainedRun {
  std::vector<double> losses;
  double grad_norm_step1 = 0.0;
  std::vector<Tensor> grads_step1;  // logical tensors, after the reductions, before clipping
};

/// Runs `steps` optimizer steps; keeps step 1's gradients (gathered over dp under ZeRO, then
/// over tp) and grad norm.
inline TrainedRun train_steps(Trainer& trainer, int steps) {
  TrainedRun run;
  ProcessGroup& tp = trainer.mesh().group(Axis::tp);
  for (int s = 0; s < steps; ++s) {
    const Trainer::Gradients g = trainer.compute_gradients(s);
    if (s == 0) {
      run.grad_norm_step1 = g.grad_norm;
      for (const Parameter* p : trainer.parameters()) {
        run.grads_step1.push_back(gather_logical(*p, trainer.zero().gather_grad(*p), tp));
      }
    }
    run.losses.push_back(g.loss);
    trainer.apply_update(s, g.grad_norm);
  }
  return run;
}

inline double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float v : t.span_f32()) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    m = std::max(m, static_cast<double>(std::abs(a.f32()[i] - b.f32()[i])));
  }
  return m;
}

}  // namespace meshtrain::test
