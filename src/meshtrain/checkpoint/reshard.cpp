#include "meshtrain/checkpoint/reshard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/checkpoint/training_state.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/mesh/placement.h"

namespace meshtrain {
namespace {

// The model.* settings check_config names for `c` over its own world (pp · dp · cp · tp).
std::set<std::string> model_issues(const Config& c) {
  const ParallelConfig& p = c.parallel;
  std::set<std::string> out;
  for (const ConfigIssue& i : check_config(c, static_cast<int>(p.pp * p.dp * p.cp * p.tp))) {
    if (i.setting.starts_with("model.")) out.insert(i.setting);
  }
  return out;
}

// validate_or_throw, except that a model rule broken by the target tp gets a fix naming the
// tp values that keep this model: training's own fix (change the model) is what reshard forbids.
void validate_target(const Config& target, int world) {
  std::vector<ConfigIssue> issues = check_config(target, world);
  if (issues.empty()) return;
  Config one = target;
  one.parallel.tp = 1;
  const std::set<std::string> without_tp = model_issues(one);
  std::vector<std::int64_t> valid;  // tp splits heads: a divisor of n_head (≤ 1024, as validate)
  for (std::int64_t tp = 1; tp <= std::min<std::int64_t>(target.model.n_head, 1024); ++tp) {
    if (target.model.n_head % tp != 0) continue;
    Config c = target;
    c.parallel.tp = tp;
    const std::set<std::string> with = model_issues(c);
    if (std::includes(without_tp.begin(), without_tp.end(), with.begin(), with.end())) {
      valid.push_back(tp);
    }
  }
  for (ConfigIssue& i : issues) {
    if (!i.setting.starts_with("model.") || without_tp.contains(i.setting)) continue;
    i.fix = fmt::format(
        "choose parallel.tp from {{{}}} (reshard keeps the checkpoint's model){}",
        fmt::join(valid, ", "),
        i.setting == "model.block_size" ? ", or parallel.sequence_parallel = false" : "");
  }
  throw ConfigError(target.source, std::move(issues));
}

// The trainer's resume warning (train/trainer_checkpoint.cpp), given when the checkpoint is
// rewritten: another global batch draws other sequences from step + 1 on.
void warn_on_global_batch(const TrainingState& saved, const Config& target) {
  const std::int64_t now = global_batch_of(target);
  if (saved.global_batch == now) return;
  const TrainingConfig& t = target.training;
  const std::int64_t dp = target.parallel.dp, want = saved.global_batch;
  std::string keep;
  if (want % (dp * t.accumulation) == 0) {
    keep = fmt::format("--training.micro_batch {} ({} × {} × {})", want / (dp * t.accumulation), dp,
                       want / (dp * t.accumulation), t.accumulation);
  } else if (want % (dp * t.micro_batch) == 0) {
    keep = fmt::format("--training.accumulation {} ({} × {} × {})", want / (dp * t.micro_batch), dp,
                       t.micro_batch, want / (dp * t.micro_batch));
  } else {
    keep =
        fmt::format("a parallel.dp dividing {} with micro_batch and accumulation to match", want);
  }
  fmt::print(stderr,
             "meshtrain: warning: the checkpoint was trained with a global batch of {} "
             "sequences, this target uses {} (dp × micro_batch × accumulation = {} × {} × {}): "
             "the resumed run's data differ from the run that saved it; to keep {}, give {}\n",
             want, now, dp, t.micro_batch, t.accumulation, want, keep);
}

// Bytes of the regular files in `dir` (a checkpoint: no sub-folders).
std::uintmax_t files_size(const std::filesystem::path& dir) {
  std::uintmax_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::error_code ec;
    if (entry.is_regular_file(ec)) bytes += entry.file_size(ec);
  }
  return bytes;
}

// out_root must be a folder or not exist (nor anything above it be a file); the nearest
// existing folder at or above it, where space is measured.
std::filesystem::path check_output_root(const std::filesystem::path& out_root) {
  std::filesystem::path at = std::filesystem::absolute(out_root);
  std::error_code ec;
  while (!std::filesystem::exists(at, ec) && at.has_parent_path() && at != at.parent_path()) {
    at = at.parent_path();
  }
  if (!std::filesystem::is_directory(at, ec)) {
    throw ConfigError(
        "the command line",
        {{"out", out_root.string(),
          at == std::filesystem::absolute(out_root)
              ? "must be a folder or not exist: reshard writes <out>/step-N/ into it, and " +
                    out_root.string() + " is a file"
              : "must be a folder or not exist: " + at.string() + " above it is a file",
          "name a checkpoints folder (e.g. runs/<name>/checkpoints), or move the file away"}});
  }
  return at;
}

}  // namespace

void check_output_space(const std::filesystem::path& out_root, std::uintmax_t needed_bytes,
                        std::uintmax_t available_bytes) {
  if (needed_bytes <= available_bytes) return;
  constexpr double kMib = 1024.0 * 1024.0;
  throw DataError(fmt::format(
      "not enough space for the resharded checkpoint in {}: it needs about {:.1f} MiB (the "
      "source checkpoint's files), the filesystem has {:.1f} MiB free; nothing was written — "
      "free {:.1f} MiB there, or name an output folder on another filesystem",
      out_root.string(), static_cast<double>(needed_bytes) / kMib,
      static_cast<double>(available_bytes) / kMib,
      static_cast<double>(needed_bytes - available_bytes) / kMib));
}

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
  validate_target(target, world);
  const PlacementTable table = placement_table(target);
  const MeshShape& shape = table.mesh();

  const std::int64_t step = reader.step();
  const std::filesystem::path target_dir = checkpoint_path(out_root, step);
  std::error_code ec;
  const std::filesystem::path source = std::filesystem::weakly_canonical(src, ec);
  const std::filesystem::path out = std::filesystem::weakly_canonical(out_root, ec);
  // Into the checkpoint being read, or a folder inside it: refused, the source stays as it was.
  const auto [mismatch, rest] = std::mismatch(source.begin(), source.end(), out.begin(), out.end());
  if (mismatch == source.end() || std::filesystem::weakly_canonical(target_dir, ec) == source) {
    throw ConfigError("the command line",
                      {{"out", out_root.string(),
                        "would replace the checkpoint being read (" + src.string() + ")",
                        "write into another checkpoints folder"}});
  }
  // A checkpoint already at the target step is not replaced: it may be the only copy of a run.
  if (std::filesystem::exists(target_dir, ec)) {
    throw ConfigError("the command line",
                      {{"out", out_root.string(),
                        "already holds " + target_dir.filename().string() +
                            "; reshard does not replace a checkpoint",
                        "remove " + target_dir.string() + " first, or choose another --out"}});
  }
  const std::filesystem::path existing = check_output_root(out_root);
  // The output holds the same elements as the source: about its bytes. Unknown space: no check.
  if (const std::filesystem::space_info room = std::filesystem::space(existing, ec); !ec) {
    check_output_space(out_root, files_size(src), room.available);
  }
  warn_on_global_batch(parse_training_state(reader.state(), src), target);
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
