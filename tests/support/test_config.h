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
  return dir != nullptr ? dir : "build/test_data/shakespeare_char";
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

}  // namespace meshtrain::test
