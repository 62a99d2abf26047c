// src/meshtrain/layers/non_finite_grads.h
//
// Where a non-finite gradient first appeared (DESIGN invariant 7, issue 17 item 8). A NaN or
// an inf in one rank's gradient reaches every rank of a group through the reduction that sums
// the gradients — the dp (dp × cp, expert-dp) all-reduce or reduce-scatter, gpt2's tied
// embedding sum over pp, the sequence-parallel sum over tp — and after it every rank holds it:
// scanning the reduced gradients blames whichever rank is looked at first. So each rank checks
// what it contributes as it posts it, while the gradients are hot in cache (Megatron-LM's
// check_for_nan_in_grad in its DDP start_grad_sync), and notes the first non-finite element;
// a dp all-reduce in a shared-memory window checks every member's input in the pass that sums
// it instead, and the rank notes what it reports (note()). After a non-finite grad norm the
// trainer gathers the notes. The check only reads: gradients stay bit for bit what they were.
// Uses: kernels (all_finite), layers/parameter.h, comm/.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/layers/parameter.h"

namespace meshtrain {

/// The reductions that can spread a gradient value to other ranks, in the order a step runs
/// them (OptimizerState::reduce_gradients): a note from an earlier one is nearer the origin.
enum class GradReduction : std::uint8_t { replicas, tied_embedding, sequence_parallel };

/// The first non-finite gradient element one rank put into a reduction.
struct NonFiniteGrad {
  const Parameter* param = nullptr;
  std::int64_t element = 0;  // in param's flattened local tensor (its tp shard)
  float value = 0.0f;
  GradReduction reduction = GradReduction::replicas;
  std::string before;  // what it was about to enter, e.g. "the all-reduce over dp{0,1}"
};

class NonFiniteGradWatch {
 public:
  /// `values` are elements [offset, offset + values.size()) of p's flattened local gradient,
  /// which this rank is about to send into `op` ("all-reduce", "reduce-scatter", …) over
  /// `group`, a reduction of kind `reduction`. Notes their first non-finite element unless a
  /// note was taken already this step. One read pass (kernels::all_finite); none after a note.
  void check(const Parameter& p, std::span<const float> values, std::int64_t offset,
             GradReduction reduction, std::string_view op, const ProcessGroup& group);
  /// Notes that element `element` of p's flattened local gradient was `value` (non-finite) as
  /// this rank sent it into `op` over `group`, unless a note was taken already this step: for
  /// a reduction that checked its own inputs (CommRequest::first_non_finite_input).
  void note(const Parameter& p, std::int64_t element, float value, GradReduction reduction,
            std::string_view op, const ProcessGroup& group);
  /// This step's note; empty when every checked gradient was finite.
  const std::optional<NonFiniteGrad>& first() const noexcept { return first_; }
  /// Forgets the note: the gradients were zeroed for the next step.
  void clear() noexcept { first_.reset(); }

 private:
  std::optional<NonFiniteGrad> first_;
};

}  // namespace meshtrain
