// The pipeline rules of config/pipeline_rules.h: how the layers are cut into pp × v chunks, and
// that every bad split or schedule is a config error naming the setting, value, rule and fix.
#include "meshtrain/config/pipeline_rules.h"

#include <gtest/gtest.h>

#include <numeric>

#include "meshtrain/config/validate.h"

namespace meshtrain {
namespace {

Config pipeline(std::int64_t layers, std::int64_t pp, std::int64_t v, PipelineSchedule schedule,
                std::int64_t m) {
  Config c;
  c.model.n_layer = layers;
  c.parallel.pp = pp;
  c.parallel.virtual_stages = v;
  c.parallel.pp_schedule = schedule;
  c.training.accumulation = m;
  return c;
}

std::string issues_of(const Config& c) {
  return format_config_issues(c.source, check_config(c, static_cast<int>(c.parallel.pp)));
}

TEST(PipelineRules, EvenSplitGivesTheFirstChunksTheRemainderAndCoversEveryLayer) {
  for (std::int64_t layers = 1; layers <= 13; ++layers) {
    for (std::int64_t chunks = 1; chunks <= layers; ++chunks) {
      Config c = pipeline(layers, chunks, 1, PipelineSchedule::one_f_one_b, 1);
      const std::vector<std::int64_t> split = layers_per_chunk(c);
      ASSERT_EQ(static_cast<std::int64_t>(split.size()), chunks);
      EXPECT_EQ(std::accumulate(split.begin(), split.end(), std::int64_t{0}), layers);
      for (std::size_t i = 0; i < split.size(); ++i) {
        EXPECT_EQ(split[i], layers / chunks + (static_cast<std::int64_t>(i) < layers % chunks));
      }
    }
  }
  EXPECT_EQ(layers_per_chunk(pipeline(8, 2, 2, PipelineSchedule::interleaved_1f1b, 4)),
            (std::vector<std::int64_t>{2, 2, 2, 2}));
}

TEST(PipelineRules, ExplicitSplitIsUsedAndEveryBadOneIsAnError) {
  Config c = pipeline(6, 2, 1, PipelineSchedule::one_f_one_b, 2);
  c.parallel.pp_layers = "4, 2";
  EXPECT_EQ(layers_per_chunk(c), (std::vector<std::int64_t>{4, 2}));
  EXPECT_TRUE(check_config(c, 2).empty()) << issues_of(c);
  for (const char* bad : {"3,0,3", "3,2", "6", "3,x", "3,,3", "-1,7"}) {
    c.parallel.pp_layers = bad;
    EXPECT_TRUE(layers_per_chunk(c).empty()) << bad;
    const std::string text = issues_of(c);
    EXPECT_NE(text.find(std::string("parallel.pp_layers = ") + bad), std::string::npos) << text;
    EXPECT_NE(text.find("summing to model.n_layer = 6"), std::string::npos) << text;
    EXPECT_NE(text.find("fix:"), std::string::npos) << text;
  }
}

TEST(PipelineRules, TooFewLayersForTheChunksIsAnError) {
  const Config c = pipeline(3, 2, 2, PipelineSchedule::interleaved_1f1b, 2);
  const std::string text = issues_of(c);
  EXPECT_NE(text.find("model.n_layer = 3"), std::string::npos) << text;
  EXPECT_NE(text.find("pp × virtual_stages = 4"), std::string::npos) << text;
  EXPECT_TRUE(layers_per_chunk(c).empty());
}

TEST(PipelineRules, ScheduleRulesReachCheckConfig) {
  EXPECT_NE(issues_of(pipeline(4, 2, 2, PipelineSchedule::one_f_one_b, 2))
                .find("parallel.virtual_stages = 2"),
            std::string::npos);
  EXPECT_NE(issues_of(pipeline(4, 2, 2, PipelineSchedule::interleaved_1f1b, 3))
                .find("training.accumulation = 3"),
            std::string::npos);
  // An unknown schedule name is rejected when loaded (config_test, BadEnumNames...).
  for (const auto& [name, text, what] : kPipelineScheduleNames) {
    const std::int64_t v = name == PipelineSchedule::interleaved_1f1b ? 2 : 1;
    const Config c = pipeline(8, 2, v, name, 4);
    EXPECT_TRUE(check_config(c, 2).empty()) << name << ": " << issues_of(c);
  }
}

}  // namespace
}  // namespace meshtrain
