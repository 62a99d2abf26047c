// src/meshtrain/train/train_data.h
//
// The run's data: data.dir's token files (data.train_file, data.val_file) in data.format, its
// meta.json for meshtrain's own format, and a global-batch sampler of data.sampler's order over
// each (data/sampler.h: global batch s depends only on (seed, s), DESIGN invariant 2).
// Everything here only reads files; nothing is allocated from the tracked allocator.
// Uses: data/, config/. Knows nothing of the mesh (ranks pick their sequences elsewhere).
#pragma once

#include <memory>

#include "meshtrain/config/config.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/data/token_file.h"

namespace meshtrain {

/// data.format "meshtrain": meta.json of config.data.dir (DataError with a hint when the
/// directory was never prepared); sets model.vocab_size from it when the config leaves it 0, a
/// different non-zero value is a ConfigError. "nanogpt" and "llmc": no file is read; the
/// vocabulary size is model.vocab_size (> 0 by validation), the token counts and width are
/// filled in by TrainData from the files, and the CharVocab is empty.
data::Metadata load_run_metadata(Config& config);

class TrainData {
 public:
  /// Opens data.train_file and data.val_file of config.data.dir as data.format says (DataError
  /// for a missing or corrupt file, an id ≥ the vocabulary size, or token counts that differ
  /// from meta.json's) and builds their samplers of global_batch_of(config) sequences of
  /// model.block_size tokens in data.sampler's order.
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
