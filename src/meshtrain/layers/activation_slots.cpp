#include "meshtrain/layers/activation_slots.h"

namespace meshtrain {
namespace {
thread_local int t_activation_slot = 0;
}  // namespace

int current_activation_slot() noexcept { return t_activation_slot; }

ActivationSlotScope::ActivationSlotScope(int slot) : previous_(t_activation_slot) {
  MT_CHECK(slot >= 0, "activation slot {} must be ≥ 0", slot);
  t_activation_slot = slot;
}

ActivationSlotScope::~ActivationSlotScope() { t_activation_slot = previous_; }

}  // namespace meshtrain
