#include "meshtrain/checkpoint/reshard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <limits>

#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/comm/device_mesh.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/layers/placement.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/dp/zero.h"

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
  const MeshShape shape{.pp = static_cast<int>(par.pp),
                        .dp = static_cast<int>(par.dp),
                        .cp = static_cast<int>(par.cp),
                        .tp = static_cast<int>(par.tp),
                        .ep = static_cast<int>(par.ep)};
  const int world = shape.world_size();  // ep is carved out of dp
  validate_or_throw(target, world);

  const std::int64_t step = reader.step();
  const std::filesystem::path target_dir = checkpoint_path(out_root, step);
  std::error_code ec;
  if (std::filesystem::weakly_canonical(target_dir, ec) ==
      std::filesystem::weakly_canonical(src, ec)) {
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
  const bool low = target.training.precision != Precision::fp32;
  const int zero = static_cast<int>(par.zero_stage);
  nlohmann::json state = reader.state();
  state["mesh"] = checkpoint_mesh_json(par, world);
  try {
    // Rank 0 last: it completes the checkpoint once every other rank's manifest is written.
    for (int rank = world - 1; rank >= 0; --rank) {
      const MeshCoords c = shape.coords_of(rank);
      // The rank's tp shards and (ep rank d mod ep, comm/device_mesh.h) its experts, from
      // groups of the right size and rank that never communicate.
      const auto tp = detached_group(c.tp, shape.tp, "tp");
      const auto ep = detached_group(c.dp % shape.ep, shape.ep, "ep");
      std::unique_ptr<PipelineStage> stage;
      {
        const ParallelGroups groups(TensorParallel{*tp, par.sequence_parallel}, ContextParallel{},
                                    ExpertParallel{ep.get()});
        stage = std::make_unique<PipelineStage>(  // shapes and shards only, no values
            target, static_cast<std::uint64_t>(target.training.seed), groups, c.pp,
            ParameterStorage::deferred);
      }
      RankSnapshot snapshot{.step = step,
                            .rank = rank,
                            .world = world,
                            .pieces = {},
                            .state = rank == 0 ? state : nlohmann::json::object(),
                            .config_toml = rank == 0 ? checkpoint_toml(target) : std::string()};
      const PlacementRanks ranks = placement_ranks(shape, rank);
      for (const Parameter* p : stage->parameters()) {
        // The same rule as Trainer::save_checkpoint: one copy of every element.
        if (!counts_this_copy(*p, ranks, zero >= 1)) continue;
        const auto [begin, end] =
            zero_owned_range(zero, shape_numel(p->local_shape()), ranks.replica(p->replicas),
                             replica_count(shape, p->replicas), low);
        if (begin == end) continue;
        const ShardPiece piece{.slice = p->shard, .begin = begin, .end = end};
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
