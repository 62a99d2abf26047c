// Loading a sharded checkpoint checks values as well as checksums (issue 17 item 8): a
// checkpoint whose files are intact (sizes and XXH64 right) but hold a NaN in a master weight
// or an infinity in an AdamW moment — what a run that saved after diverging leaves, or a
// hostile file signed again — is refused
//   - by an explicit resume on every rank, naming the checkpoint, the tensor and the logical
//     index of the first bad element, with nothing loaded (the rank that reads the file is
//     the last one; the others learn the verdict from it), under dp with ZeRO-1 and, at even
//     world sizes, tp 2 (the bad element in a tp shard, its index mapped by ShardSlice's rule);
//   - by checkpoint.resume = "auto", which falls back to the previous complete checkpoint;
//   - by `meshtrain export`'s and `sample`'s reader (load_logical_model), with the same
//     message, when the bad value is a weight (they read no moments).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "shared_dir.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::quiet;

// dp = world (ZeRO-1 above one rank: each rank reads only its own file), or tp 2 × dp world/2.
Config values_config(int world, bool tp) {
  const int tp_size = tp ? 2 : 1, dp = world / tp_size;
  Config cfg = test::small_config(dp, 8 / dp, 1);
  cfg.parallel.tp = tp_size;
  cfg.parallel.zero_stage = dp > 1 ? 1 : 0;
  cfg.training.max_steps = 10;
  cfg.checkpoint.interval = 5;
  return cfg;
}

std::vector<std::vector<float>> masters_of(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const OptimizerShard& s : t.zero().shards()) {
    const auto v = s.master.span_f32();
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

std::string hex64_of(std::span<const std::byte> bytes) {
  return fmt::format("{:016x}", XXH64(bytes.data(), bytes.size(), 0));
}

// The element a test poisons in a rank file: its key there, its index in the piece and in the
// logical tensor.
struct Poison {
  std::string key;
  std::int64_t local = 0, logical = 0;
};

// The logical index of element `k` of a rank's local tensor (the tp shard `slice` as a
// manifest stores it), by layers/parameter.h's ShardSlice rule; −1 for padding.
std::int64_t logical_index(const json& slice, const Shape& shape, std::int64_t k) {
  const auto dim = slice.at("dim").get<std::size_t>();
  const auto parts = slice.at("parts").get<std::int64_t>();
  const auto offset = slice.at("offset").get<std::int64_t>();
  const auto length = slice.at("length").get<std::int64_t>();
  const auto stride = slice.at("stride").get<std::int64_t>();
  Shape local = shape;
  local[dim] = parts * stride;
  std::vector<std::int64_t> at(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {  // unravel k in the local shape
    at[d] = k % local[d];
    k /= local[d];
  }
  if (at[dim] % stride >= length) return -1;
  at[dim] = at[dim] / stride * (shape[dim] / parts) + offset + at[dim] % stride;
  std::int64_t logical = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) logical = logical * shape[d] + at[d];
  return logical;
}

// The first real (not padding) element from the middle of the first piece of `shard`.
Poison poison_target(const fs::path& shard, std::string_view field) {
  const json manifest = json::parse(std::ifstream(fs::path(shard).replace_extension(".json")));
  const json& piece = manifest.at("pieces").at(0);
  const std::string name = piece.at("name").get<std::string>();
  const auto shape = piece.at("shape").get<Shape>();
  const auto begin = piece.at("begin").get<std::int64_t>();
  const auto end = piece.at("end").get<std::int64_t>();
  Poison p{.key = field.empty() ? name : fmt::format("{}/{}", name, field)};
  for (p.local = (end - begin) / 2; p.local < end - begin; ++p.local) {
    p.logical = logical_index(piece.at("slice"), shape, begin + p.local);
    if (p.logical >= 0) break;
  }
  EXPECT_GE(p.logical, 0) << "no real element in the second half of " << name << "'s piece";
  return p;
}

// Writes `value` at `poison` in `shard` and signs the checkpoint `dir` again: the file's size
// and XXH64 in metadata.json, metadata.json's in COMPLETE.
void poison_shard(const fs::path& dir, const fs::path& shard, const Poison& poison, float value) {
  SafetensorsFile file = decode_safetensors(read_file_bytes(shard), shard);
  std::vector<NamedTensor> tensors;
  for (auto& [key, t] : file.tensors) {
    if (key == poison.key) t.span_f32()[static_cast<std::size_t>(poison.local)] = value;
    tensors.push_back({key, std::move(t)});
  }
  const std::vector<std::byte> bytes = encode_safetensors(tensors);
  std::ofstream(shard, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  json metadata = json::parse(std::ifstream(dir / "metadata.json"));
  metadata["files"][shard.filename().string()] = {{"bytes", bytes.size()},
                                                  {"xxh64", hex64_of(bytes)}};
  const std::string text = metadata.dump(1);
  std::ofstream(dir / "metadata.json", std::ios::trunc) << text;
  std::string complete, line;
  for (std::ifstream in(dir / "COMPLETE"); std::getline(in, line);) {
    if (!line.starts_with("metadata_xxh64 ")) complete += line + "\n";
  }
  complete += "metadata_xxh64 " + hex64_of(std::as_bytes(std::span<const char>(text))) + "\n";
  std::ofstream(dir / "COMPLETE", std::ios::trunc) << complete;
}

struct Case {
  std::string name;
  std::string_view field;
  float value;
  bool tp = false;  // tp 2: the poisoned piece is a tp shard (np 2, 4)
};

class NonFiniteCheckpoint : public ::testing::TestWithParam<Case> {};

TEST_P(NonFiniteCheckpoint, IsRefusedNamingTheTensorAndElementAndAutoFallsBack) {
  const Case& c = GetParam();
  const auto world = test::runtime().world_group();
  const fs::path dir = test::shared_temp_dir(*world, "meshtrain_ckpt_values_");
  ASSERT_FALSE(dir.empty());
  Config cfg = values_config(world->size(), c.tp);
  cfg.checkpoint.dir = dir.string();
  Trainer(cfg, *world, quiet()).run();  // complete checkpoints at steps 5 and 10
  const fs::path newest = dir / "checkpoints" / "step-00000010";
  const fs::path shard = newest / fmt::format("rank-{:05d}.safetensors", world->size() - 1);
  const Poison poison = poison_target(shard, c.field);
  const std::string culprit =
      fmt::format("checkpoint {}: tensor {} holds a non-finite value ({}) at element {}",
                  newest.string(), poison.key, c.value, poison.logical);
  if (world->rank() == 0) poison_shard(newest, shard, poison, c.value);
  world->barrier();

  Config load = values_config(world->size(), c.tp);
  load.checkpoint.dir = (dir / "load").string();
  Trainer fresh(load, *world, quiet());
  const auto before = masters_of(fresh);
  try {
    fresh.load_checkpoint(newest);
    ADD_FAILURE() << "a checkpoint holding a non-finite value loaded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(culprit), std::string::npos) << e.what();
  }
  EXPECT_EQ(masters_of(fresh), before) << "a failed load changed the weights";
  EXPECT_EQ(fresh.start_step(), 0);

  Config autoload = values_config(world->size(), c.tp);
  autoload.checkpoint.dir = dir.string();
  autoload.checkpoint.resume = "auto";
  Trainer resumed(autoload, *world, quiet());
  EXPECT_EQ(resumed.start_step(), 5);

  // What `meshtrain export` and `sample` read the checkpoint with: the weights only, so a bad
  // moment does not concern them.
  if (world->rank() == 0 && c.field == kMasterField) {
    try {
      (void)load_logical_model(newest);
      ADD_FAILURE() << "export's reader accepted a non-finite value";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(culprit), std::string::npos) << e.what();
    }
  } else if (world->rank() == 0) {
    EXPECT_NO_THROW((void)load_logical_model(newest));
  }
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

std::vector<Case> value_cases() {
  std::vector<Case> cases{{"nan_master", kMasterField, std::nanf("")},
                          {"inf_exp_avg_sq", kExpAvgSqField, INFINITY}};
  if (test::launched_world_size() % 2 == 0) {
    cases.push_back({"tp2_nan_master", kMasterField, std::nanf(""), true});
    cases.push_back({"tp2_inf_exp_avg", kExpAvgField, -INFINITY, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Values, NonFiniteCheckpoint, ::testing::ValuesIn(value_cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.name; });

}  // namespace
}  // namespace meshtrain
