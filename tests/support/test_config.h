// tests/support/test_config.h — the small GPT config the distributed and end-to-end tests
// train, and where the prepared Tiny Shakespeare lives for them.
#pragma once

#include <cstdlib>
#include <string>

#include "meshtrain/config/config.h"

namespace meshtrain::test {

/// Directory of train.bin/val.bin/meta.json, prepared by the CTest fixture `prepare_data`
/// (env MESHTRAIN_TEST_DATA) — never ../shared.
inline std::string test_data_dir() {
  const char* dir = std::getenv("MESHTRAIN_TEST_DATA");
  if (dir != nullptr) return dir;
#ifdef MESHTRAIN_TEST_DATA_DIR
  return MESHTRAIN_TEST_DATA_DIR;  // unit_tests: set by tests/CMakeLists.txt
#else
  return "build/test_data/shakespeare_char";
#endif
}

/// 2 layers, 2 heads, 32 features, 32 tokens per sequence, biases on (so every kind of
/// parameter is covered), fp32; global batch = micro_batch × accumulation × dp.
inline Config small_config(std::int64_t dp, std::int64_t micro_batch, std::int64_t accumulation) {
  Config c;
  c.source = "test config";
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.block_size = 32;
  c.model.bias = true;
  c.training.micro_batch = micro_batch;
  c.training.accumulation = accumulation;
  c.training.max_steps = 20;
  c.training.warmup_steps = 5;
  c.training.lr = 3e-3;
  c.training.min_lr = 3e-4;
  c.training.grad_clip = 1.0;
  c.training.eval_interval = 0;
  c.training.eval_batches = 2;
  c.training.threads = 1;
  c.parallel.dp = dp;
  c.data.dir = test_data_dir();
  c.checkpoint.save_final = false;
  return c;
}

/// The tensor-parallel tests' model: `family` gpt2 (4 heads) or llama (8 heads sharing 4
/// kv heads, SwiGLU of 96, untied head), 2 layers, 32 features, 32 tokens per sequence, so
/// heads, kv heads, MLP features and sequence divide by tp ∈ {1, 2, 4}; the vocabulary (65) does
/// not, so padding is exercised.
inline Config small_tp_config(ModelFamily family, std::int64_t dp, std::int64_t tp,
                              bool sequence_parallel, std::int64_t micro_batch,
                              std::int64_t accumulation) {
  Config c = small_config(dp, micro_batch, accumulation);
  c.model.family = family;
  if (family == ModelFamily::llama) {
    c.model.n_head = 8;
    c.model.n_kv_head = 4;
    c.model.ffn_hidden = 96;
    c.model.bias = false;
  } else {
    c.model.n_head = 4;
  }
  c.parallel.tp = tp;
  c.parallel.sequence_parallel = sequence_parallel;
  return c;
}

/// Makes `c` (a llama) the small MoE model of the expert-parallel checkpoint tests: 4 SwiGLU
/// experts of 48, top-2, dropless, aux 0.01 and z 0.001 (both depend on which tokens a
/// micro-batch holds: keep training.micro_batch when comparing layouts), at parallel.ep = ep.
inline void make_moe(Config& c, std::int64_t ep) {
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_ffn_hidden = 48;
  c.model.moe_aux_loss_coeff = 0.01;
  c.model.moe_z_loss_coeff = 0.001;
  c.parallel.ep = ep;
}

}  // namespace meshtrain::test
