// The dynamic loss scaler's arithmetic (optim/loss_scaler.h): skips, backoff after the
// hysteresis, growth after growth_interval clean steps, the floor at 1. The all-ranks
// agreement is tested under mpirun (tests/dist/train/precision_test.cpp).
#include "meshtrain/optim/loss_scaler.h"

#include <gtest/gtest.h>

namespace meshtrain {
namespace {

TEST(LossScaler, BacksOffAfterHysteresisOverflowsAndGrowsAfterTheInterval) {
  DynamicLossScaler s({.initial_scale = 1024.0,
                       .growth_interval = 3,
                       .growth = 2.0,
                       .backoff = 0.5,
                       .hysteresis = 2});
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_TRUE(s.update(true));  // skipped, first of the hysteresis: scale kept
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_TRUE(s.update(true));  // second: backs off
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_TRUE(s.update(true));  // hysteresis used up: every further overflow backs off
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_EQ(s.skipped_steps(), 3);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_FALSE(s.update(false));  // third clean step in a row: grows, hysteresis refilled
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512.0) << "hysteresis 2 was refilled by the growth";
}

TEST(LossScaler, AnOverflowRestartsTheGrowthCountAndTheScaleStaysAtLeastOne) {
  DynamicLossScaler s({.initial_scale = 2.0,
                       .growth_interval = 2,
                       .growth = 2.0,
                       .backoff = 0.25,
                       .hysteresis = 1});
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(true));  // resets the clean-step count
  EXPECT_EQ(s.scale(), 1.0);    // 2 · 0.25 = 0.5, floored at 1
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 2.0);
}

TEST(LossScaler, GrowthStopsAtTheMaximumScale) {
  DynamicLossScaler s({.initial_scale = 4.0,
                       .growth_interval = 1,
                       .growth = 1000.0,
                       .backoff = 0.5,
                       .hysteresis = 1,
                       .max_scale = 16777216.0});
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 4000.0);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 4000000.0);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 16777216.0) << "capped at 2^24";
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 16777216.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 8388608.0);
}

}  // namespace
}  // namespace meshtrain
