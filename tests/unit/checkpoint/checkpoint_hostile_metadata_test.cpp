// A hostile or damaged metadata.json (checkpoint/sharded_checkpoint.h, CheckpointReader): file
// names that leave the checkpoint directory, fields of the wrong type, shapes that overflow or
// that the files on disk cannot hold, and slices outside their tensor are each a DataError
// naming metadata.json and the field, before any file is opened or any tensor allocated.
// (tests/fuzz/checkpoint_metadata_fuzz.cpp feeds the reader arbitrary files; these are the
// cases it must refuse, stated one by one.)
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "support/temp_files.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/file_name.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A checkpoint whose metadata.json is `metadata`, with a 64-byte rank file.
json valid_metadata() {
  const json slice = {{"dim", 0}, {"parts", 1}, {"offset", 0}, {"length", 4}, {"stride", 4}};
  return {{"format", "meshtrain sharded checkpoint"},
          {"version", 1},
          {"step", 3},
          {"config", ""},
          {"state", json::object()},
          {"files", {{"rank-00000.safetensors", {{"bytes", 64}, {"xxh64", "0"}}}}},
          {"tensors",
           {{"w",
             {{"shape", {4}},
              {"dtype", "F32"},
              {"pieces",
               {{{"name", "w"},
                 {"file", "rank-00000.safetensors"},
                 {"shape", {4}},
                 {"slice", slice},
                 {"begin", 0},
                 {"end", 4}}}}}}}}};
}

// The error of opening a checkpoint with `metadata` and reading tensor "w" ("" when none).
std::string error_of(const json& metadata) {
  const test::TempDir tmp;
  test::write_file(tmp.path() / "COMPLETE", "step 3\n");
  test::write_file(tmp.path() / "metadata.json", metadata.dump());
  test::write_file(tmp.path() / "rank-00000.safetensors", std::string(64, '\0'));
  try {
    CheckpointReader reader(tmp.path());
    reader.read_logical("w");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

void expect_error(const json& metadata, const std::string& field) {
  const std::string error = error_of(metadata);
  EXPECT_NE(error.find("metadata.json"), std::string::npos) << error;
  EXPECT_NE(error.find(field), std::string::npos) << "expected " << field << " in: " << error;
}

TEST(CheckpointHostileMetadata, FileNamesOutsideTheDirectoryAreRefusedBeforeAnyRead) {
  for (const std::string name :
       {"../outside.safetensors", "/etc/passwd", "sub/rank.safetensors", "..", "a\\b", ""}) {
    json m = valid_metadata();
    m["files"][name] = {{"bytes", 64}, {"xxh64", "0"}};
    m["tensors"]["w"]["pieces"][0]["file"] = name;
    expect_error(m, "\"files\" is " + json(name).dump());
    EXPECT_NE(error_of(m).find("inside the checkpoint directory"), std::string::npos);
  }
}

TEST(CheckpointHostileMetadata, APieceNamingAnUnlistedFileIsRefused) {
  json m = valid_metadata();
  m["tensors"]["w"]["pieces"][0]["file"] = "rank-00001.safetensors";
  expect_error(m, "\"tensors.w.pieces\"");
}

TEST(CheckpointHostileMetadata, FieldsOfTheWrongTypeAreDataErrors) {
  json m = valid_metadata();
  m["step"] = "3";
  expect_error(m, "\"step\" is \"3\", expected an integer ≥ 0");
  m = valid_metadata();
  m["format"] = 7;
  expect_error(m, "not the metadata of a meshtrain sharded checkpoint");
  m = valid_metadata();
  m["version"] = "1";
  expect_error(m, "format version \"1\"");
  m = valid_metadata();
  m["files"]["rank-00000.safetensors"]["bytes"] = -1;
  expect_error(m, "\"files.rank-00000.safetensors\"");
  m = valid_metadata();
  m["tensors"]["w"]["pieces"] = json::object();
  expect_error(m, "\"tensors.w\"");
}

TEST(CheckpointHostileMetadata, ShapesAreCheckedBeforeAnyAllocation) {
  json m = valid_metadata();
  m["tensors"]["w"]["shape"] = {-4};
  expect_error(m, "\"tensors.w.shape\" is [-4], expected dimensions that are integers ≥ 0");
  m["tensors"]["w"]["shape"] = {1LL << 40, 1LL << 40};
  expect_error(m, "\"tensors.w.shape\"");
  // Fits in memory arithmetic but not in the 64 bytes on disk: refused before allocating.
  m["tensors"]["w"]["shape"] = {1LL << 40};
  m["tensors"]["w"]["pieces"][0]["shape"] = {1LL << 40};
  const std::string error = error_of(m);
  EXPECT_NE(error.find("tensor w of shape 1099511627776 needs 4398046511104 bytes, more than "
                       "the 64 bytes of the files holding it"),
            std::string::npos)
      << error;
}

TEST(CheckpointHostileMetadata, SlicesOutsideTheirTensorAreRefused) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::int64_t>>{
           {"stride", 1LL << 62},
           {"offset", std::numeric_limits<std::int64_t>::max() - 1},
           {"parts", 0},
           {"dim", 1}}) {
    json m = valid_metadata();
    m["tensors"]["w"]["pieces"][0]["slice"][key] = value;
    expect_error(m, "a piece of w");
    EXPECT_NE(error_of(m).find("lies outside its tensor"), std::string::npos) << key;
  }
  json m = valid_metadata();
  m["tensors"]["w"]["pieces"][0]["end"] = 5;
  expect_error(m, "lies outside its tensor");
}

TEST(CheckpointHostileMetadata, PlainFileNames) {
  EXPECT_TRUE(is_plain_file_name("rank-00000.safetensors"));
  EXPECT_TRUE(is_plain_file_name("..hidden"));
  for (const std::string_view name : {"", ".", "..", "../x", "/x", "a/b", "a\\b"}) {
    EXPECT_FALSE(is_plain_file_name(name)) << name;
  }
  EXPECT_FALSE(is_plain_file_name(std::string_view("a\0b", 3)));
}

}  // namespace
}  // namespace meshtrain
