// tests/dist/equivalence_harness.h — the scaffolding every dist equivalence suite shares (DESIGN
// invariants 1 and 3): train one process and a layout at the same global batch, then compare
// step 1's grad norm, step 1's gradients (each of this rank's parameters, gathered to its
// logical tensor, against the reference's parameter of the same name) and every step's loss,
// each within the tolerance the suite states. The suites keep what only their layouts have
// (configs, layouts, the bytes each group moves, per-feature extra checks).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "support/training_run.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/config/config.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::test {

/// Relative bounds, each against the reference: |Δ grad norm| ≤ norm_rtol · norm;
/// max |Δg| ≤ grad_rtol · max |g| per parameter; |Δ loss| ≤ loss_rtol · |loss| per step.
struct Tolerances {
  double grad_rtol;
  double norm_rtol;
  double loss_rtol;
};

/// Compares `got` (of the trainer whose parameters are `got_params`) with `want` (of
/// `want_params`): step 1's grad norm, every gradient of `got_params` against `want`'s parameter
/// of the same name (every one must have one), the number of steps and every step's loss.
void expect_equivalent(const TrainedRun& want, const ParameterList& want_params,
                       const TrainedRun& got, const ParameterList& got_params,
                       const Tolerances& tolerances);

/// Where a layout's initial weights are read: the parameters' values, or (ZeRO) the fp32
/// master slices gathered over dp.
enum class InitialWeights { values, zero_masters };

/// A reference trainer on a one-rank group (every rank runs it, no communication) and the
/// layout's trainer on the world, built in that order; `train` runs both, and
/// `expect_equivalent` compares them.
class Equivalence {
 public:
  Equivalence(const Config& single, const Config& layout);

  Trainer& reference() { return *reference_; }
  Trainer& parallel() { return *parallel_; }

  /// Invariant 1: every parameter of the layout, gathered over tp (from `source`), equals the
  /// reference's parameter of the same name bit for bit (fatal on the first that does not).
  void expect_same_initial_weights(InitialWeights source = InitialWeights::values);

  /// Trains `steps` steps of the reference, then of the layout.
  void train(int steps);
  const TrainedRun& want() const { return want_; }
  const TrainedRun& got() const { return got_; }

  /// The losses, gradients and grad norm of `train`'s runs (test::expect_equivalent).
  void expect_equivalent(const Tolerances& tolerances) const;

 private:
  std::unique_ptr<ProcessGroup> self_;
  std::unique_ptr<ProcessGroup> world_;
  std::unique_ptr<Trainer> reference_;
  std::unique_ptr<Trainer> parallel_;
  TrainedRun want_;
  TrainedRun got_;
};

}  // namespace meshtrain::test
