// src/meshtrain/checkpoint/reshard.h
//
// `meshtrain reshard`: a sharded checkpoint re-cut for another layout offline, in one process
// without MPI. A training run can load any layout's checkpoint itself (Trainer::load_checkpoint
// reshards at load time); this writes the target layout's files ahead of time, e.g. to hand a
// checkpoint to a job whose ranks should each read only their own file.
#pragma once

#include <filesystem>

#include "meshtrain/config/config.h"

namespace meshtrain {

/// Reads the complete checkpoint `src` and writes it for the layout of `target` (its parallel
/// section and training.precision; world = pp · dp · cp · tp, ep carved out of dp) as
/// <out_root>/step-<same step>/: every target rank's pieces (checkpoint/shard_map.h; each
/// rank's shards, and under ep its experts, computed by building its pipeline stage over
/// layout-only tp and ep groups, comm/single_rank_group.h), the same optimizer,
/// scheduler, scaler and data state with the target mesh, metadata.json and COMPLETE. Returns
/// that directory. Memory: one target rank's pieces plus the source files they overlap.
/// Errors: ConfigError when `target` breaks a layout rule or changes a model setting (the
/// model must stay the checkpoint's); DataError for a bad source (as CheckpointReader) or an
/// output that cannot be written. A failure leaves no COMPLETE marker, so a half-written
/// output is never loaded.
std::filesystem::path reshard_checkpoint(const std::filesystem::path& src, const Config& target,
                                         const std::filesystem::path& out_root);

}  // namespace meshtrain
