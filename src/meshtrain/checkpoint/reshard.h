// src/meshtrain/checkpoint/reshard.h
//
// `meshtrain reshard`: a sharded checkpoint re-cut for another layout offline, in one process
// without MPI. A training run can load any layout's checkpoint itself (Trainer::load_checkpoint
// reshards at load time); this writes the target layout's files ahead of time, e.g. to hand a
// checkpoint to a job whose ranks should each read only their own file.
#pragma once

#include <cstdint>
#include <filesystem>

#include "meshtrain/config/config.h"

namespace meshtrain {

/// Reads the complete checkpoint `src` and writes it for the layout of `target` (its parallel
/// section and training.precision; world = pp · dp · cp · tp, ep carved out of dp) as
/// <out_root>/step-<same step>/: every target rank's pieces (checkpoint/shard_map.h; the
/// tensors, tp slices, experts and ZeRO ranges each rank holds, read off the placement table,
/// mesh/placement.h, without building a model), the same optimizer, scheduler, scaler and data
/// state with the target mesh, metadata.json and COMPLETE. Returns that directory. Memory: one
/// target rank's pieces plus the source files they overlap. Warns on stderr, as a resume does,
/// when the target's global batch (dp × micro_batch × accumulation) differs from the
/// checkpoint's: the resumed run would draw other data.
/// Errors, all before anything is written: ConfigError when `target` breaks a layout rule (a
/// model rule broken by tp names the tp values this model allows) or changes a model setting
/// (the model must stay the checkpoint's), or when `out_root` is a file or the checkpoint being
/// read; DataError for a bad source (as CheckpointReader) or too little free space for about
/// the source's bytes (check_output_space). A write that fails later leaves no output (it is
/// staged and renamed into place), so a half-written checkpoint is never loaded.
std::filesystem::path reshard_checkpoint(const std::filesystem::path& src, const Config& target,
                                         const std::filesystem::path& out_root);

/// Throws DataError naming `out_root`, both sizes (MiB) and a fix when `needed_bytes` exceed
/// `available_bytes` (std::filesystem::space's available, for the output's filesystem).
void check_output_space(const std::filesystem::path& out_root, std::uintmax_t needed_bytes,
                        std::uintmax_t available_bytes);

}  // namespace meshtrain
