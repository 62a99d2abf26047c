// src/meshtrain/layers/activation_slots.h
//
// Where a layer keeps what its backward needs, so that several micro-batches can be in flight
// at once. A pipeline schedule runs F, B (and W, weight_grad_queue.h) of different
// micro-batches interleaved: 1F1B runs the forward of micro-batch i+1 before the backward of
// micro-batch i (Narayanan et al. 2021, §2.2), zero-bubble schedules run a micro-batch's W long
// after its B (Qi et al. 2023, §2). One copy of each saved tensor per layer would only allow
// F, B, F, B; instead every layer keeps its saved state in a Saved<State>, one State per
// *activation slot*.
//
// The slot is the `slot` of the MicroBatchContext (micro_batch_context.h) each forward,
// backward and discard receives. The pipeline executor gives every (micro-batch, chunk) its
// own; outside pipelines everything runs in slot 0, so a plain forward/backward behaves
// exactly as with one copy. A forward in a slot overwrites what an earlier forward in the
// same slot kept (an evaluation forward without backward leaves nothing extra behind);
// backward takes the slot's state and frees it.
//
// Different model chunks of one rank (interleaved schedules) are different layer objects, so
// they may use the same micro-batch index as slot. A layer object is driven by one thread at a
// time (Saved itself has no lock).
#pragma once

#include <cstddef>
#include <map>
#include <string_view>
#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/layers/micro_batch_context.h"

namespace meshtrain {

/// What a layer keeps between forward and backward, one State per activation slot. State is a
/// plain struct of the layer's saved tensors (and small host data); its destructor frees them.
template <typename State>
class Saved {
 public:
  /// Slot `slot`'s State, default-constructed on first use.
  State& at(int slot) { return by_slot_[slot]; }

  /// True when `slot` holds a State (a forward ran in it and no backward took it).
  bool has(int slot) const { return by_slot_.contains(slot); }

  /// Moves `slot`'s State out and drops the slot: the tensors are freed when the returned
  /// State is destroyed (at the end of the backward that took it). MT_CHECKs that the slot
  /// holds one ("backward without a forward").
  State take(int slot, std::string_view who = "layer") {
    auto it = by_slot_.find(slot);
    MT_CHECK(it != by_slot_.end(), "{}: backward without a forward in activation slot {}", who,
             slot);
    State state = std::move(it->second);
    by_slot_.erase(it);
    return state;
  }

  /// Drops `slot`'s State (frees its tensors); nothing when it holds none.
  void release(int slot) { by_slot_.erase(slot); }

  /// Slots holding a State.
  std::size_t live_slots() const { return by_slot_.size(); }

 private:
  std::map<int, State> by_slot_;  // node-based: a State's address is stable while it lives
};

}  // namespace meshtrain
