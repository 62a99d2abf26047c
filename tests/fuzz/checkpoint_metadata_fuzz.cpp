// tests/fuzz/checkpoint_metadata_fuzz.cpp — a sharded checkpoint's metadata.json.
//
// The input replaces metadata.json in a real checkpoint of two small tensors that the product's
// CheckpointWriter writes once per process (so the seed metadata names its rank file with the
// right size and XXH64); its COMPLETE marker carries no metadata hash, so the reader goes on
// to parse what the fuzzer wrote. The reader is then used as `meshtrain export` and reshard
// use it: step, state, config, and every field of every logical tensor.
#include <fmt/format.h>

#include <stdexcept>
#include <string_view>

#include "fuzz_support.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/config/load.h"

namespace {

namespace fs = std::filesystem;
using namespace meshtrain;

PieceState whole_piece(std::string name, const Shape& shape) {
  Tensor master = Tensor::zeros(shape, MemCategory::other);
  for (std::int64_t i = 0; i < master.numel(); ++i) master.f32()[i] = 0.25f * float(i);
  return {.name = std::move(name),
          .piece = {.slice = whole(shape), .begin = 0, .end = shape_numel(shape)},
          .master = master,
          .exp_avg = Tensor::zeros(shape, MemCategory::other),
          .exp_avg_sq = Tensor::zeros(shape, MemCategory::other)};
}

// The checkpoint directory, written on first use.
const fs::path& checkpoint_dir() {
  static const fs::path dir = [] {
    const fs::path root = fuzz::scratch_dir() / "checkpoints";
    prepare_checkpoint_dir(root, 1);
    CheckpointWriter writer({.root = root, .keep_last = 1, .async = false});
    writer.save({.step = 1,
                 .rank = 0,
                 .world = 1,
                 .pieces = {whole_piece("transformer.wte.weight", {4, 3}),
                            whole_piece("transformer.ln_f.bias", {3})},
                 .state = {{"data", {{"position", 7}}}},
                 .config_toml = to_toml(Config{})});
    if (const std::string error = writer.wait(); !error.empty()) {
      throw std::runtime_error("fuzz harness: cannot write the checkpoint: " + error);
    }
    const fs::path step_dir = checkpoint_path(root, 1);
    fuzz::write_file(step_dir / "COMPLETE", std::string_view("step 1\n"));
    return step_dir;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path& dir = checkpoint_dir();
  fuzz::write_file(dir / "metadata.json",
                   std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::refuse_cleanly([&] {
    CheckpointReader reader(dir);
    reader.step();
    reader.state();
    reader.config();
    for (const std::string& name : reader.tensor_names()) {
      reader.logical_shape(name);
      for (std::string_view field : {kMasterField, kExpAvgField, kExpAvgSqField}) {
        fuzz::refuse_cleanly([&] { reader.read_logical(name, field); });
      }
    }
  });
  return 0;
}
