// tests/reference/hf_init_dump.cpp
//
// The C++ half of reference.hf_init_matches_transformers: builds the single-process model of a
// meshtrain config, fills every parameter from a Hugging Face model through HfImport (the
// loader of checkpoint.init_from: a file, a sharded index or a directory; F32, BF16 or F16),
// and writes tokens [batch, T] I32 and meshtrain's logits [batch·T, V] F32 to <out>; the
// config's vocab_size must be given (model.vocab_size), as no data directory is read.
// hf_init_reference.py then computes transformers' logits of the same tokens. With
// --checkpoint-out DIR META it also writes the model as a run's final checkpoint (DIR:
// model.safetensors in meshtrain's layout, config.toml, META copied to meta.json), the input of
// `meshtrain export` in reference.export_tokenizer_matches_transformers.
//
//   hf_init_dump <config.toml> <init_from> <out.safetensors> [--checkpoint-out DIR META]
//                [--section.key value ...]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/checkpoint/model_checkpoint.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/model/causal_lm.h"

namespace meshtrain {
namespace {

constexpr std::uint64_t kSeed = 2024;
constexpr std::int64_t kBatch = 2;
constexpr std::int64_t kMaxTokens = 48;  // per sequence: the logits check, not a long context

struct Args {
  std::string config, init_from, out, checkpoint_dir, meta_json;
  std::vector<std::string> overrides;
};

int run(const Args& args) {
  const std::string& config_path = args.config;
  const std::string& init_from = args.init_from;
  const std::string& out = args.out;
  const auto start = std::chrono::steady_clock::now();
  Config config = load_config_file(config_path, parse_overrides(args.overrides));
  config.checkpoint.init_from = init_from;
  validate_or_throw(config, 1);
  const ModelConfig& mc = config.model;
  if (mc.vocab_size <= 0) throw DataError(fmt::format("{}: set model.vocab_size", config_path));
  HfImport import(init_from, mc);
  import.check_values();
  const auto self = single_rank_group("tp");
  CausalLm model(mc, kSeed, TensorParallel{*self});
  for (Parameter* p : model.parameters()) import.fill(*p, 0, p->value.numel(), p->value.f32());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const std::int64_t T = std::min(mc.block_size, kMaxTokens);
  Tensor tokens = Tensor::empty({kBatch, T}, MemCategory::other, DType::i32);
  const std::uint64_t stream = stream_of("hf_init_dump.tokens");
  for (std::int64_t i = 0; i < kBatch * T; ++i) {
    tokens.i32()[i] =
        static_cast<std::int32_t>(philox_u64(kSeed, stream, static_cast<std::uint64_t>(i)) %
                                  static_cast<std::uint64_t>(mc.vocab_size));
  }
  const Tensor logits = model.logits(tokens.i32(), kBatch, T, {}).clone(MemCategory::other);
  write_safetensors(out, {{"tokens", tokens}, {"logits", logits}},
                    {{"init_from", init_from}, {"generator", "tests/reference/hf_init_dump.cpp"}});
  if (!args.checkpoint_dir.empty()) {
    std::vector<NamedTensor> params;
    for (Parameter* p : model.parameters()) params.push_back({p->name, p->value});
    save_model_checkpoint(args.checkpoint_dir, params, config, args.meta_json);
  }
  fmt::print("hf_init_dump: {} ({}) → logits [{}, {}] in {}; load {:.1f} s, total {:.1f} s\n",
             init_from, import.summary(), logits.dim(0), logits.dim(1), out, load_s,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: hf_init_dump <config.toml> <init_from> <out.safetensors> "
                 "[--checkpoint-out DIR META] [--section.key value ...]\n");
    return 2;
  }
  try {
    meshtrain::Args args;
    args.config = argv[1];
    args.init_from = argv[2];
    args.out = argv[3];
    int next = 4;
    if (argc >= 7 && std::string(argv[4]) == "--checkpoint-out") {
      args.checkpoint_dir = argv[5];
      args.meta_json = argv[6];
      next = 7;
    }
    args.overrides.assign(argv + next, argv + argc);
    return meshtrain::run(args);
  } catch (const meshtrain::DataError& e) {
    std::fprintf(stderr, "hf_init_dump: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_init_dump: %s\n", e.what());
    return 1;
  }
}
