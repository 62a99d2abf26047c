// tests/fuzz/hf_index_fuzz.cpp — a sharded Hugging Face model's model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor: shard file}}).
//
// The input is the index, beside one real shard (two small tensors, written once per
// process). Every tensor the index yields is read. A shard opened from outside the index's
// directory is a finding even when the read itself succeeds: the process aborts naming it.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fuzz_support.h"
#include "meshtrain/checkpoint/hf_weights.h"

namespace {

namespace fs = std::filesystem;
using namespace meshtrain;

// The model directory, with its shard written on first use.
const fs::path& model_dir() {
  static const fs::path dir = [] {
    const fs::path d = fuzz::scratch_dir() / "hf_model";
    fs::create_directories(d);
    Tensor wte = Tensor::zeros({4, 3}, MemCategory::other);
    Tensor bias = Tensor::zeros({3}, MemCategory::other);
    write_safetensors(d / "model-00001-of-00001.safetensors",
                      {{"transformer.wte.weight", wte}, {"transformer.ln_f.bias", bias}},
                      {{"format", "pt"}});
    return d;
  }();
  return dir;
}

void check_inside(const fs::path& file, const fs::path& dir) {
  if (file.parent_path() != dir || file.filename() == ".." || file.filename() == ".") {
    std::fprintf(stderr, "hf_index_fuzz: shard %s opened outside %s\n", file.c_str(), dir.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path& dir = model_dir();
  const fs::path index = dir / "model.safetensors.index.json";
  fuzz::write_file(index, std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::refuse_cleanly([&] {
    const HfWeights weights = open_hf_weights(index);
    for (const SafetensorsIndex& file : weights.files) check_inside(file.path, dir);
    for (const auto& [name, located] : weights.tensors) read_hf_tensor_f32(weights, name);
  });
  return 0;
}
