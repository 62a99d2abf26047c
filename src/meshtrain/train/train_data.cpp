#include "meshtrain/train/train_data.h"

#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// meta.json with a hint when the directory was never prepared: relative paths start at the
// current directory, which is where users most often go wrong.
data::Metadata load_data_metadata(const fs::path& dir) {
  try {
    return data::load_metadata(dir / data::kMetaJsonName);
  } catch (const DataError& e) {
    std::error_code ec;
    throw DataError(fmt::format(
        "{}\n  data.dir = {} (relative paths start at the current directory, {}); prepare it "
        "with: meshtrain prepare data/tinyshakespeare.txt --out {}",
        e.what(), dir.string(), fs::current_path(ec).string(), dir.string()));
  }
}

// Vocabulary size comes from the data unless the config sets it; a mismatch is a config error.
void resolve_vocab(Config& config, const data::Metadata& meta) {
  const std::int64_t data_vocab = meta.vocab_size;
  if (config.model.vocab_size == 0) {
    config.model.vocab_size = data_vocab;
  } else if (config.model.vocab_size != data_vocab) {
    throw ConfigError(
        config.source,
        {{"model.vocab_size", std::to_string(config.model.vocab_size),
          fmt::format("must equal the vocabulary of {} ({})", config.data.dir, data_vocab),
          "set model.vocab_size = 0 to take it from the data"}});
  }
}

// The sidecar and the token files must describe the same preparation.
void check_token_counts(const data::Metadata& meta, const data::TokenFile& train,
                        const data::TokenFile& val) {
  if (train.size() != meta.train_tokens || val.size() != meta.val_tokens) {
    throw DataError(fmt::format(
        "{} and {} hold {} and {} tokens, but meta.json says {} and {}: the files come from "
        "different preparations; run meshtrain prepare again",
        train.path().string(), val.path().string(), train.size(), val.size(), meta.train_tokens,
        meta.val_tokens));
  }
}

}  // namespace

data::Metadata load_run_metadata(Config& config) {
  data::Metadata meta = load_data_metadata(config.data.dir);
  resolve_vocab(config, meta);
  return meta;
}

TrainData::TrainData(const Config& config, data::Metadata metadata)
    : metadata_(std::move(metadata)) {
  const fs::path dir = config.data.dir;
  train_file_ = data::TokenFile(dir / data::kTrainBinName, metadata_.vocab_size);
  val_file_ = data::TokenFile(dir / data::kValBinName, metadata_.vocab_size);
  check_token_counts(metadata_, train_file_, val_file_);
  const std::int64_t global_batch = global_batch_of(config);
  const auto seed = static_cast<std::uint64_t>(config.training.seed);
  train_sampler_ = std::make_unique<data::GlobalBatchSampler>(train_file_, config.model.block_size,
                                                              global_batch, seed, "train");
  val_sampler_ = std::make_unique<data::GlobalBatchSampler>(val_file_, config.model.block_size,
                                                            global_batch, seed, "val");
}

}  // namespace meshtrain
