// src/meshtrain/checkpoint/sharded_checkpoint.h
//
// Sharded, resumable checkpoints (DESIGN invariant 8). A checkpoint of step s is the directory
// <root>/step-<s, 8 digits>/ holding
//   rank-NNNNN.safetensors  each rank's pieces (shard_map.h) of the parameters it updates: the
//                           fp32 master values under the parameter's name and the AdamW
//                           moments under <name>/exp_avg and <name>/exp_avg_sq, f32 [end − begin]
//   rank-NNNNN.json         that rank's manifest: its file's size, XXH64 and pieces
//   metadata.json           the whole state: the resolved config, mesh, step, every logical
//                           tensor's shape and the pieces that hold it, optimizer, LR schedule,
//                           loss scaler, data position and RNG, and every file's size and XXH64
//   COMPLETE                written last; a directory without it is never loaded
// Every file is written under a temporary name, fsynced and renamed (core/staged_file.h); the
// directory is fsynced before COMPLETE is written, and again after.
//
// Saving is each rank's own: the rank's pieces are copied into host buffers (RankSnapshot) and
// a background thread encodes, hashes and writes them, then the manifest; world rank 0's
// thread then waits for every rank's manifest on the shared file system (no MPI call off the
// main thread), writes metadata.json and COMPLETE, and removes all but the newest keep_last
// complete checkpoints. A second save waits for the first.
//
// Loading reads metadata.json, checks each file it needs against its size and XXH64 before
// using it, refuses a NaN or an infinity among the values it loads, and fills any wanted piece from the stored pieces that overlap it (resharding:
// any dp, tp, pp, virtual-stage or ZeRO layout reads any other's checkpoint).
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "meshtrain/checkpoint/shard_map.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {

/// The fields one piece stores besides the master value (the AdamW moments, Loshchilov &
/// Hutter 2019, Alg. 2: m and v). Keys in a rank file: "<name>" and "<name>/<field>".
inline constexpr std::string_view kMasterField = "";
inline constexpr std::string_view kExpAvgField = "exp_avg";
inline constexpr std::string_view kExpAvgSqField = "exp_avg_sq";

/// One piece of one parameter as a rank saves it: f32 [end − begin] host copies.
struct PieceState {
  std::string name;
  ShardPiece piece;
  Tensor master, exp_avg, exp_avg_sq;
};

/// Everything one rank saves. `state` is used from world rank 0 only: the JSON of the
/// non-tensor state (step, optimizer, scheduler, loss scaler, data, rng, mesh) that goes into
/// metadata.json next to the config and the tensors.
struct RankSnapshot {
  std::int64_t step = 0;
  int rank = 0;
  int world = 1;
  std::vector<PieceState> pieces;
  nlohmann::json state;
  std::string config_toml;  // the resolved config (config/load.h to_toml), rank 0
};

/// "<root>/step-00000042".
std::filesystem::path checkpoint_path(const std::filesystem::path& root, std::int64_t step);

/// Complete checkpoints under `root` (directories step-N holding COMPLETE), newest first.
/// None (or no root) gives an empty list.
std::vector<std::filesystem::path> complete_checkpoints(const std::filesystem::path& root);

/// Removes the step-N directories under `root` that hold no COMPLETE marker — saves that a
/// crash, a kill or a full disk ended — and returns them. World rank 0 only, when no save of
/// this job is in flight (resume = auto calls it before loading): a failed save's shards would
/// otherwise keep their disk space until the next save completes, which on a full disk it
/// cannot (docs/resilience.md, "A full disk"). Nothing complete is touched.
std::vector<std::filesystem::path> remove_incomplete_checkpoints(const std::filesystem::path& root);

/// World rank 0, before a save of `step` (then a barrier): creates `root` and removes what a
/// crashed earlier run may have left at that step's path, so no stale file mixes in.
/// Throws DataError naming the directory when it cannot be created.
void prepare_checkpoint_dir(const std::filesystem::path& root, std::int64_t step);

struct CheckpointWriterOptions {
  std::filesystem::path root;
  std::int64_t keep_last = 2;
  bool async = true;
  // Rank 0 waits this long for the other ranks' manifests before giving up on the checkpoint
  // (it then stays incomplete, so it is never loaded).
  double finalize_timeout_s = 600.0;
};

/// One per rank; writes RankSnapshots (see the file comment). Not thread-safe: the training
/// thread calls save() and wait().
class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointWriterOptions options);
  /// Waits for a save in flight (errors are dropped: the destructor cannot report them).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Waits for the previous save, then writes `snapshot` (in the background when async). The
  /// directory must have been prepared (prepare_checkpoint_dir and a barrier).
  void save(RankSnapshot snapshot);
  /// Blocks until this rank's last save is done; returns its error ("" when it succeeded or
  /// there was none). Rank 0's save is done when COMPLETE is written.
  std::string wait();
  /// Wall seconds the last finished save spent writing (encode, hash, files; rank 0: until
  /// COMPLETE), and its directory. 0 and "" before the first one.
  double last_write_seconds() const noexcept { return write_s_; }
  const std::filesystem::path& last_dir() const noexcept { return dir_; }

 private:
  void write(const RankSnapshot& snapshot);

  CheckpointWriterOptions options_;
  std::thread thread_;
  std::string error_;
  double write_s_ = 0.0;
  std::filesystem::path dir_;
};

/// A complete checkpoint opened for loading. The constructor reads COMPLETE and metadata.json
/// only; tensor files are read, size- and XXH64-checked on first use and kept in memory until
/// the reader is destroyed.
class CheckpointReader {
 public:
  /// Throws DataError naming the file for a directory without COMPLETE, a missing or
  /// malformed metadata.json, or one that is not a meshtrain checkpoint.
  explicit CheckpointReader(std::filesystem::path dir);

  const std::filesystem::path& dir() const noexcept { return dir_; }
  std::int64_t step() const;
  /// The non-tensor state saved by rank 0 (RankSnapshot::state).
  const nlohmann::json& state() const;
  /// The config the checkpoint was trained with. Throws DataError when it does not parse.
  Config config() const;
  /// Names of the logical tensors, sorted.
  std::vector<std::string> tensor_names() const;
  /// Throws DataError when the checkpoint has no tensor `name`.
  Shape logical_shape(const std::string& name) const;

  /// Fills `out` (f32, dst.end − dst.begin elements) with `field` (kMasterField, kExpAvgField,
  /// kExpAvgSqField) of parameter `name` for the piece `dst`, padding zero. Throws DataError
  /// naming the checkpoint, the file or the tensor when: the tensor is not in the checkpoint,
  /// its logical shape differs from dst's, a file it needs is missing, truncated or fails its
  /// XXH64, the stored pieces do not cover dst, or a value filled in is NaN or infinite (the
  /// message names the checkpoint, the tensor's key, e.g. "<name>/exp_avg_sq", the value and
  /// the element's row-major index in the logical tensor; finite_values.h).
  void fill(const std::string& name, std::string_view field, const ShardPiece& dst,
            std::span<float> out);
  /// The whole logical tensor of `field` of `name` (MemCategory::other); errors as fill().
  Tensor read_logical(const std::string& name, std::string_view field = kMasterField);

 private:
  const nlohmann::json& tensor_entry(const std::string& name) const;
  const Tensor& stored(const std::string& file, const std::string& key);

  std::filesystem::path dir_;
  nlohmann::json metadata_;
  std::map<std::string, std::map<std::string, Tensor>> files_;  // verified, decoded
};

/// The "mesh" entry of a checkpoint's state (metadata.json): the layout that wrote it, as
/// {world, dp, cp, cp_comm, tp, pp, virtual_stages, pp_schedule, sequence_parallel, zero_stage,
/// ep}. Informational (a checkpoint loads under any layout); checkpoints from before a setting
/// existed lack its key (cp, ep: 1).
nlohmann::json checkpoint_mesh_json(const ParallelConfig& parallel, int world);

/// The first setting of the model section in which `a` and `b` differ, as "model.key: A vs B";
/// "" when they describe the same model (what a checkpoint's tensors depend on).
std::string model_difference(const ModelConfig& a, const ModelConfig& b);

}  // namespace meshtrain
