// src/meshtrain/core/restart_count.h — which attempt of a job this process belongs to
// (docs/resilience.md, "Fault injection"). `meshtrain launch` (launch/launch_plan.h) exports
// the restarts done before each attempt to its ranks; the ranks read it here (the fault
// injector fires on the first attempt only). Like torchrun's TORCHELASTIC_RESTART_COUNT.
#pragma once

namespace meshtrain {

/// The environment variable `meshtrain launch` sets for the ranks of every attempt: the
/// restarts before it (0 on the first attempt).
inline constexpr const char* kRestartCountEnv = "MESHTRAIN_RESTART_COUNT";

/// The restarts of this job before this attempt: the larger of MESHTRAIN_RESTART_COUNT and
/// Slurm's SLURM_RESTART_COUNT (a requeued batch job); 0 when neither is set to a whole
/// number > 0.
int restart_count_from_env();

}  // namespace meshtrain
