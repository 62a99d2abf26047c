// src/meshtrain/core/env_switch.h — on/off switches read from the environment (for A/B runs
// and work-arounds, not for the model's settings, which live in the config). A switch is
// unset, "1" or "0"; anything else is an error naming the variable, never silently "on".
#pragma once

#include <optional>
#include <string>

#include "meshtrain/core/error.h"

namespace meshtrain {

/// MESHTRAIN_SHM_ALL_REDUCE=0: data parallel's all-reduce goes by MPI messages even when the
/// dp group shares a node (comm/shared_window.h; docs/data_parallel.md). Every rank must see
/// the same value (mpirun -x); where they differ, no rank uses the window.
inline constexpr const char* kShmAllReduceEnv = "MESHTRAIN_SHM_ALL_REDUCE";

/// The issue for switch `name` set to `value` (as it should read in the message, e.g.
/// "'off'" or "rank 1: 'off'"): the rule (0 or 1, on every rank) and the fix.
ConfigIssue bad_env_switch(const char* name, std::string value);

/// The problem with switch `name`'s value, if any: none when unset, "0" or "1".
std::optional<ConfigIssue> env_switch_issue(const char* name);

/// Switch `name`: `unset` when it is not in the environment, else "1" → true, "0" → false.
/// Throws ConfigError (source "environment") for any other value, e.g. "off" or "true".
bool env_switch(const char* name, bool unset);

}  // namespace meshtrain
