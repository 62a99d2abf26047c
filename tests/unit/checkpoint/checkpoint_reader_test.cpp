// Naming the wrong folder as a checkpoint (checkpoint/sharded_checkpoint.h, CheckpointReader):
// a run's checkpoint.dir and its checkpoints/ folder each get a message saying what to name
// instead; a folder with neither is a save that never finished.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/temp_files.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

std::string reader_error(const fs::path& dir) {
  try {
    CheckpointReader reader(dir);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointReader, AWrongFolderIsNamedWithWhatToNameInstead) {
  const test::TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const fs::path step = run / "checkpoints" / "step-00000005";
  fs::create_directories(step);
  std::ofstream(step / "COMPLETE") << "step 5\n";

  const std::string of_run = reader_error(run);
  EXPECT_NE(of_run.find(run.string() + " is a run's checkpoint.dir, not a checkpoint"),
            std::string::npos)
      << of_run;
  EXPECT_NE(of_run.find("checkpoint.resume = \"auto\" with checkpoint.dir = " + run.string()),
            std::string::npos)
      << of_run;

  const std::string of_folder = reader_error(run / "checkpoints");
  EXPECT_NE(of_folder.find("holds checkpoints (step-N directories) but is not one"),
            std::string::npos)
      << of_folder;

  fs::create_directories(tmp.path() / "half");
  const std::string of_half = reader_error(tmp.path() / "half");
  EXPECT_NE(of_half.find("no COMPLETE marker, so its save never finished"), std::string::npos)
      << of_half;
}

}  // namespace
}  // namespace meshtrain
