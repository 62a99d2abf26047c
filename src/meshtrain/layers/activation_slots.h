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
// The current slot is a per-thread int, 0 unless an ActivationSlotScope says otherwise. The
// pipeline executor sets it to the micro-batch index around each F, B and W of that
// micro-batch; outside pipelines everything runs in slot 0, so a plain forward/backward
// behaves exactly as with one copy. A forward in a slot overwrites what an earlier forward in
// the same slot kept (an evaluation forward without backward leaves nothing extra behind);
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

namespace meshtrain {

/// This thread's current activation slot (≥ 0; 0 unless an ActivationSlotScope is alive).
int current_activation_slot() noexcept;

/// Sets this thread's activation slot for its lifetime and restores the previous one when it
/// ends (scopes nest). MT_CHECKs slot ≥ 0.
class ActivationSlotScope {
 public:
  explicit ActivationSlotScope(int slot);
  ~ActivationSlotScope();
  ActivationSlotScope(const ActivationSlotScope&) = delete;
  ActivationSlotScope& operator=(const ActivationSlotScope&) = delete;

 private:
  int previous_;
};

/// What a layer keeps between forward and backward, one State per activation slot. State is a
/// plain struct of the layer's saved tensors (and small host data); its destructor frees them.
template <typename State>
class Saved {
 public:
  /// The current slot's State, default-constructed on first use.
  State& operator*() { return by_slot_[current_activation_slot()]; }
  State* operator->() { return &**this; }

  /// True when the current slot holds a State (a forward ran in it and no backward took it).
  bool has() const { return by_slot_.contains(current_activation_slot()); }

  /// Moves the current slot's State out and drops the slot: the tensors are freed when the
  /// returned State is destroyed (at the end of the backward that took it). MT_CHECKs that
  /// the slot holds one ("backward without a forward").
  State take(std::string_view who = "layer") {
    const int slot = current_activation_slot();
    auto it = by_slot_.find(slot);
    MT_CHECK(it != by_slot_.end(), "{}: backward without a forward in activation slot {}", who,
             slot);
    State state = std::move(it->second);
    by_slot_.erase(it);
    return state;
  }

  /// Drops the current slot's State (frees its tensors); nothing when it holds none.
  void release() { by_slot_.erase(current_activation_slot()); }

  /// Slots holding a State.
  std::size_t live_slots() const { return by_slot_.size(); }

 private:
  std::map<int, State> by_slot_;  // node-based: a State's address is stable while it lives
};

}  // namespace meshtrain
