// Tests of checkpoint/reshard.h's check_output_space, the refusal of a reshard whose output
// filesystem lacks room (a full disk cannot be made in a test; the sizes are given instead).
#include <gtest/gtest.h>

#include <string>

#include "meshtrain/checkpoint/reshard.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

TEST(ReshardSpace, EnoughRoomPasses) {
  EXPECT_NO_THROW(check_output_space("out/checkpoints", 10 << 20, 10 << 20));
  EXPECT_NO_THROW(check_output_space("out/checkpoints", 0, 0));
}

TEST(ReshardSpace, TooLittleRoomNamesPathSizesAndFix) {
  try {
    check_output_space("out/checkpoints", 30 << 20, 10 << 20);
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out/checkpoints"), std::string::npos) << m;
    EXPECT_NE(m.find("needs about 30.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("has 10.0 MiB free"), std::string::npos) << m;
    EXPECT_NE(m.find("free 20.0 MiB there, or name an output folder on another filesystem"),
              std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace meshtrain
