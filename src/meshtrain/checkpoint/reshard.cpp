#include "meshtrain/checkpoint/reshard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/mesh/placement.h"

namespace meshtrain {

std::filesystem::path reshard_checkpoint(const std::filesystem::path& src, const Config& target,
                                         const std::filesystem::path& out_root) {
  CheckpointReader reader(src);
  const Config saved = reader.config();
  if (const std::string d = model_difference(saved.model, target.model); !d.empty()) {
    throw ConfigError(target.source, {{"model", d, "reshard changes the layout, never the model",
                                       "leave the model settings as the checkpoint has them"}});
  }
  const ParallelConfig& par = target.parallel;
  // One piece per target rank is written: a world beyond any cluster (2^20 ranks, the
  // planner's bound) is refused before it is multiplied out in int and before anything is written.
  std::int64_t rank_count = 1;
  for (const std::int64_t size : {par.pp, par.dp, par.cp, par.tp}) {
    if (size < 1) rank_count = 0;  // validate_or_throw names the size
    if (rank_count > 0 && rank_count > (std::int64_t{1} << 20) / size) {
      throw ConfigError(target.source,
                        {{"parallel.pp × dp × cp × tp",
                          fmt::format("{} × {} × {} × {}", par.pp, par.dp, par.cp, par.tp),
                          "must be at most 2^20 ranks: reshard writes one piece per rank",
                          "give the layout you will resume on"}});
    }
    rank_count *= size;
  }
  const int world = static_cast<int>(rank_count);  // ep is carved out of dp
  validate_or_throw(target, world);
  const PlacementTable table = placement_table(target);
  const MeshShape& shape = table.mesh();

  const std::int64_t step = reader.step();
  const std::filesystem::path target_dir = checkpoint_path(out_root, step);
  std::error_code ec;
  const std::filesystem::path source = std::filesystem::weakly_canonical(src, ec);
  const std::filesystem::path out = std::filesystem::weakly_canonical(out_root, ec);
  // Into the checkpoint being read, or a folder inside it: refused, the source stays as it was.
  const auto [mismatch, rest] = std::mismatch(source.begin(), source.end(), out.begin(), out.end());
  if (mismatch == source.end() ||
      std::filesystem::weakly_canonical(target_dir, ec) == source) {
    throw ConfigError("the command line",
                      {{"out", out_root.string(),
                        "would replace the checkpoint being read (" + src.string() + ")",
                        "write into another checkpoints folder"}});
  }
  // Written under a staging folder beside the target and renamed into place at the end, so a
  // failure leaves any existing checkpoint at the target untouched.
  const std::filesystem::path staging =
      out_root / fmt::format(".reshard-{}-step-{:08d}", ::getpid(), step);
  std::filesystem::remove_all(staging, ec);
  prepare_checkpoint_dir(staging, step);
  // No pruning: out_root may hold the user's other checkpoints.
  CheckpointWriter writer({.root = staging,
                           .keep_last = std::numeric_limits<std::int64_t>::max(),
                           .async = false,
                           .finalize_timeout_s = 1.0});
  nlohmann::json state = reader.state();
  state["mesh"] = checkpoint_mesh_json(par, world);
  try {
    // Rank 0 last: it completes the checkpoint once every other rank's manifest is written.
    for (int rank = world - 1; rank >= 0; --rank) {
      const MeshCoords c = shape.coords_of(rank);
      RankSnapshot snapshot{.step = step,
                            .rank = rank,
                            .world = world,
                            .pieces = {},
                            .state = rank == 0 ? state : nlohmann::json::object(),
                            .config_toml = rank == 0 ? checkpoint_toml(target) : std::string()};
      const PlacementRanks ranks = placement_ranks(shape, rank);
      // The rank's tensors, slices and ZeRO ranges from the placement table alone: no model.
      for (const ParamPlacement* p : table.held_by(c)) {
        // The same rule as Trainer::save_checkpoint: one copy of every element.
        if (!p->counts_copy(ranks)) continue;
        const auto [begin, end] = p->zero_range(shape, c);
        if (begin == end) continue;
        const ShardPiece piece{.slice = p->slice(shape, c), .begin = begin, .end = end};
        PieceState s{.name = p->name,
                     .piece = piece,
                     .master = Tensor::empty({end - begin}, MemCategory::other),
                     .exp_avg = Tensor::empty({end - begin}, MemCategory::other),
                     .exp_avg_sq = Tensor::empty({end - begin}, MemCategory::other)};
        reader.fill(p->name, kMasterField, piece, s.master.span_f32());
        reader.fill(p->name, kExpAvgField, piece, s.exp_avg.span_f32());
        reader.fill(p->name, kExpAvgSqField, piece, s.exp_avg_sq.span_f32());
        snapshot.pieces.push_back(std::move(s));
      }
      writer.save(std::move(snapshot));
      if (const std::string error = writer.wait(); !error.empty()) throw DataError(error);
    }
  } catch (...) {
    std::filesystem::remove_all(staging, ec);
    throw;
  }
  std::filesystem::remove_all(target_dir, ec);
  std::filesystem::rename(checkpoint_path(staging, step), target_dir, ec);
  std::filesystem::remove_all(staging);
  if (ec) {
    throw DataError(fmt::format("cannot move the resharded checkpoint into {}: {}",
                                target_dir.string(), ec.message()));
  }
  sync_directory(out_root);
  return target_dir;
}

}  // namespace meshtrain
