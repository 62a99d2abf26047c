// src/meshtrain/train/train_data.h
//
// The run's data: data.dir's meta.json, its train.bin and val.bin, and a global-batch sampler
// over each (data/sampler.h: global batch s depends only on (seed, s), DESIGN invariant 2).
// Everything here only reads files; nothing is allocated from the tracked allocator.
// Uses: data/, config/. Knows nothing of the mesh (ranks pick their sequences elsewhere).
#pragma once

#include <memory>

#include "meshtrain/config/config.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/data/token_file.h"

namespace meshtrain {

/// meta.json of config.data.dir (DataError with a hint when the directory was never
/// prepared). Sets model.vocab_size from it when the config leaves it 0; a different non-zero
/// value is a ConfigError.
data::Metadata load_run_metadata(Config& config);

class TrainData {
 public:
  /// Opens train.bin and val.bin of config.data.dir (DataError for a missing or corrupt file,
  /// or token counts that differ from `metadata`'s) and builds their samplers of
  /// global_batch_of(config) sequences of model.block_size tokens.
  TrainData(const Config& config, data::Metadata metadata);
  TrainData(const TrainData&) = delete;  // the samplers point into the token files' mappings
  TrainData& operator=(const TrainData&) = delete;

  const data::Metadata& metadata() const noexcept { return metadata_; }
  const data::GlobalBatchSampler& train() const noexcept { return *train_sampler_; }
  const data::GlobalBatchSampler& val() const noexcept { return *val_sampler_; }

 private:
  data::Metadata metadata_;
  data::TokenFile train_file_, val_file_;
  std::unique_ptr<data::GlobalBatchSampler> train_sampler_, val_sampler_;
};

}  // namespace meshtrain
