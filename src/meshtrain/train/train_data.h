// src/meshtrain/train/train_data.h
//
// The run's data: data.dir's token files (data.train_file, data.val_file) in data.format, its
// meta.json for meshtrain's own format or data.tokenizer for nanoGPT's and llm.c's, and a
// global-batch sampler of data.sampler's order over each (data/sampler.h: global batch s
// depends only on (seed, s), DESIGN invariant 2). Everything here only reads files (but
// write_tokenizer, at the end of a run); nothing is allocated from the tracked allocator.
// Uses: data/, config/. Knows nothing of the mesh (ranks pick their sequences elsewhere).
#pragma once

#include <filesystem>
#include <memory>

#include "meshtrain/config/config.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/data/token_file.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {

/// What load_run_metadata found out about the data before any token file is opened.
struct RunMetadata {
  data::Metadata metadata;
  /// data.tokenizer, opened, for "nanogpt" / "llmc" data; null otherwise (meshtrain's format
  /// keeps its tokenizer beside meta.json, foreign data without data.tokenizer has none).
  std::unique_ptr<data::Tokenizer> tokenizer;
};

/// data.format "meshtrain": meta.json of config.data.dir (DataError with a hint when the
/// directory was never prepared); sets model.vocab_size from it when the config leaves it 0, a
/// different non-zero value is a ConfigError; a non-empty data.tokenizer must be meta.json's
/// (same kind, size, end-of-text id and text of every id; ConfigError otherwise).
/// "nanogpt" and "llmc": no token file is read. Without data.tokenizer the vocabulary size is
/// model.vocab_size (> 0 by validation) and the CharVocab is empty. With it, the tokenizer is
/// opened (DataError naming its file) and the metadata describes it; model.vocab_size = 0
/// becomes its size, one below it is a ConfigError, one above pads the embedding (nanoGPT's
/// 50,304 for GPT-2's 50,257) while the files' ids are still checked against the tokenizer's.
/// TrainData fills in the token counts and width from the files.
RunMetadata load_run_metadata(Config& config);

class TrainData {
 public:
  /// Opens data.train_file and data.val_file of config.data.dir as data.format says (DataError
  /// for a missing or corrupt file, an id ≥ the vocabulary size, or token counts that differ
  /// from meta.json's) and builds their samplers of global_batch_of(config) sequences of
  /// model.block_size tokens in data.sampler's order.
  TrainData(const Config& config, RunMetadata metadata);
  TrainData(const TrainData&) = delete;  // the samplers point into the token files' mappings
  TrainData& operator=(const TrainData&) = delete;

  const data::Metadata& metadata() const noexcept { return metadata_; }
  const data::GlobalBatchSampler& train() const noexcept { return *train_sampler_; }
  const data::GlobalBatchSampler& val() const noexcept { return *val_sampler_; }

  /// Foreign data read with data.tokenizer: writes the tokenizer's files and then a meta.json
  /// (v2, data/metadata.h) describing them and the token files into `dir`, each atomically,
  /// so a checkpoint directory decodes as one trained on meshtrain's format does (whose
  /// meta.json save_model_checkpoint copies). Foreign data without it: removes a meta.json an
  /// earlier run left in `dir`. Nothing for meshtrain's format. Errors: DataError naming the
  /// file that cannot be written.
  void write_tokenizer(const std::filesystem::path& dir) const;

 private:
  data::Metadata metadata_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  bool foreign_ = false;  // data.format "nanogpt" or "llmc"
  data::TokenFile train_file_, val_file_;
  std::unique_ptr<data::GlobalBatchSampler> train_sampler_, val_sampler_;
};

}  // namespace meshtrain
