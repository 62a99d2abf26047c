// Export → import round trip (issue 6 item 4) under the layouts of this world size: a model
// trained a few steps is exported to one Hugging Face file (rank 0, export_hf), a new Trainer
// with checkpoint.init_from = that file starts from it, and
//   1. its parameters, gathered to logical tensors, are bitwise the exported ones (and differ
//      from the seed's initial values, so the import did something);
//   2. it trains to bitwise the same losses as a fresh Trainer of the same layout whose fp32
//      masters were set in memory to the original trained weights (the import carries weights
//      only: both start with a fresh optimizer at step 0 of the schedule);
//   3. a file with a non-finite value (only rank 0 reads the values) makes every rank throw the
//      same DataError naming the file and the tensor, instead of one rank stopping alone.
// np 1: tp 1; np 2: tp 2, dp 2 with ZeRO-3, and pp 2; np 4: tp 2 × dp 2 with ZeRO-3. gpt2 (biases,
// the fused c_attn split over tp, a vocabulary of 65 padded over tp) and llama (GQA, untied
// head). Mixtral (issue 14): the MoE llama of test::make_moe at dp 2 × ep 2 (np 2) and
// dp 4 × ep 2 with ZeRO-3 (np 4): each ep rank holds half the experts, logical_tensors gathers
// all of them, and the import fills each ep rank's own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "support/test_config.h"
#include "support/training_run.h"
#include "dist_env.h"
#include "shared_dir.h"
#include "meshtrain/checkpoint/hf_format.h"

namespace meshtrain {
namespace {

using test::quiet;

// (family, tp, dp, zero stage, pp, ep: 0 = dense, else the MoE llama at that ep)
using Layout = std::tuple<ModelFamily, int, int, int, int, int>;

std::vector<Layout> layouts_of_this_world() {
  const int world = test::launched_world_size();
  std::vector<Layout> out;
  for (const ModelFamily family : {ModelFamily::gpt2, ModelFamily::llama}) {
    if (world == 1) out.emplace_back(family, 1, 1, 0, 1, 0);
    if (world == 2) {
      out.emplace_back(family, 2, 1, 0, 1, 0);
      out.emplace_back(family, 1, 2, 3, 1, 0);
      out.emplace_back(family, 1, 1, 0, 2, 0);  // gpt2: the tied embedding's copy on the last stage
    }
    if (world == 4) out.emplace_back(family, 2, 2, 3, 1, 0);
  }
  if (world == 2) out.emplace_back(ModelFamily::llama, 1, 2, 0, 1, 2);
  if (world == 4) out.emplace_back(ModelFamily::llama, 1, 4, 3, 1, 2);
  return out;
}

Config layout_config(const Layout& layout) {
  const auto& [family, tp, dp, zero, pp, ep] = layout;
  Config c = test::small_tp_config(family, dp, tp, false, 4 / (dp * pp), pp);
  c.parallel.zero_stage = zero;
  c.parallel.pp = pp;
  if (ep > 0) test::make_moe(c, ep);
  return c;
}

std::filesystem::path shared_temp_dir(ProcessGroup& world) {
  return test::shared_temp_dir(world, "meshtrain_export_import.");
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.f32(), b.f32(), static_cast<std::size_t>(a.bytes())) == 0;
}

std::map<std::string, Tensor> by_name(const std::vector<NamedTensor>& tensors) {
  std::map<std::string, Tensor> out;
  for (const NamedTensor& t : tensors) out.emplace(t.name, t.tensor);
  return out;
}

class ExportImport : public ::testing::TestWithParam<Layout> {};

TEST_P(ExportImport, ImportIsBitwiseTheExportAndTrainsLikeTheOriginalWeights) {
  MpiRuntime& rt = test::runtime();
  const auto world = rt.world_group();
  const std::filesystem::path dir = shared_temp_dir(*world);
  ASSERT_FALSE(dir.empty());
  const std::filesystem::path file = dir / "model.safetensors";

  Trainer original(layout_config(GetParam()), *world, quiet());
  const Config config = original.config();  // vocab_size resolved from the data
  const auto initial = by_name(original.logical_tensors());
  test::train_steps(original, 3);
  const std::vector<NamedTensor> trained = original.logical_tensors();
  if (world->rank() == 0) export_hf(trained, config, file);
  world->barrier();

  Config from_file = config;
  from_file.checkpoint.init_from = file.string();
  Trainer imported(from_file, *world, quiet());
  const auto got = by_name(imported.logical_tensors());
  ASSERT_EQ(got.size(), trained.size());
  int moved = 0;
  for (const NamedTensor& t : trained) {
    ASSERT_TRUE(got.contains(t.name)) << t.name;
    EXPECT_TRUE(bitwise_equal(got.at(t.name), t.tensor))
        << t.name << ": imported value differs from the exported one";
    if (!bitwise_equal(initial.at(t.name), t.tensor)) ++moved;
  }
  EXPECT_GT(moved, 0) << "training did not move any weight: the test would prove nothing";

  // The reference: the same layout, the trained weights written into its fp32 masters.
  Trainer reference(config, *world, quiet());
  const auto want = by_name(trained);
  for (OptimizerShard& s : reference.zero().shards()) {
    copy_range_from_logical(*s.param, want.at(s.param->name), s.begin, s.end, s.master.f32());
  }
  reference.zero().publish_parameters();
  const test::TrainedRun a = test::train_steps(imported, 4);
  const test::TrainedRun b = test::train_steps(reference, 4);
  for (std::size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s + 1 << " (fp32, same layout: bitwise)";
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

TEST_P(ExportImport, NonFiniteValueFailsOnEveryRank) {
  MpiRuntime& rt = test::runtime();
  const auto world = rt.world_group();
  const std::filesystem::path dir = shared_temp_dir(*world);
  ASSERT_FALSE(dir.empty());
  const std::filesystem::path file = dir / "model.safetensors";
  Config config;
  {
    Trainer original(layout_config(GetParam()), *world, quiet());
    config = original.config();
    const auto tensors = by_name(original.logical_tensors());
    if (world->rank() == 0) {
      // Written by hand: export_hf itself refuses non-finite values.
      std::vector<NamedTensor> out;
      for (const HfTensor& spec : hf_tensors(config.model)) {
        Tensor t = spec.name.empty() ? Tensor::zeros(spec.hf_shape(), MemCategory::other)
                                     : to_hf(tensors.at(spec.name), spec);
        if (spec.hf_name == "model.norm.weight" || spec.hf_name == "transformer.ln_f.weight") {
          t.f32()[1] = std::nanf("");
        }
        out.push_back({spec.hf_name, t});
      }
      write_safetensors(file, out, {{"format", "pt"}});
    }
    world->barrier();
  }
  Config from_file = config;
  from_file.checkpoint.init_from = file.string();
  const std::string tensor =
      config.model.family == ModelFamily::llama ? "model.norm.weight" : "transformer.ln_f.weight";
  try {
    Trainer imported(from_file, *world, quiet());
    ADD_FAILURE() << "rank " << world->rank() << " accepted a file holding a NaN";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("checkpoint.init_from"), std::string::npos) << what;
    EXPECT_NE(what.find(file.string()), std::string::npos) << what;
    EXPECT_NE(what.find(tensor), std::string::npos) << what;
    EXPECT_NE(what.find("non-finite"), std::string::npos) << what;
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& param) {
  const auto& [family, tp, dp, zero, pp, ep] = param.param;
  return std::string(ep > 0 ? "mixtral" : to_string(family)) + "_tp" + std::to_string(tp) + "_dp" +
         std::to_string(dp) + "_zero" + std::to_string(zero) + "_pp" + std::to_string(pp) +
         (ep > 0 ? "_ep" + std::to_string(ep) : "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExportImport, ::testing::ValuesIn(layouts_of_this_world()),
                         layout_name);
// np 8 runs only the tp × dp layouts it is filtered to (tests/dist/CMakeLists.txt).
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ExportImport);

}  // namespace
}  // namespace meshtrain
