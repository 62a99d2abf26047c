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

// nanoGPT's and llm.c's files come without a meta.json: the vocabulary size is the config's
// (validation requires it > 0 for these formats). This is where a tokenizer directory
// (data.tokenizer) would supply it instead; the token counts and width are the files'.
data::Metadata foreign_metadata(const Config& config) {
  data::Metadata meta;
  meta.vocab_size = config.model.vocab_size;
  meta.sources = {config.data.dir};
  return meta;
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

// How data.format's files are read; the meshtrain format's width is meta.json's.
data::TokenFileOptions file_options(const Config& config, const data::Metadata& meta) {
  data::TokenFileOptions options;
  options.vocab_size = meta.vocab_size;
  switch (config.data.format) {
    case DataFormat::meshtrain:
      options.dtype = meta.token_dtype;
      break;
    case DataFormat::nanogpt:
      options.dtype = data::TokenDtype::u16;
      break;
    case DataFormat::llmc:
      options.layout = data::TokenLayout::llmc;
      break;
  }
  return options;
}

data::SampleOrder sample_order(DataSampler sampler) {
  return sampler == DataSampler::epoch ? data::SampleOrder::epoch : data::SampleOrder::random;
}

}  // namespace

data::Metadata load_run_metadata(Config& config) {
  if (config.data.format != DataFormat::meshtrain) return foreign_metadata(config);
  data::Metadata meta = load_data_metadata(config.data.dir);
  resolve_vocab(config, meta);
  return meta;
}

TrainData::TrainData(const Config& config, data::Metadata metadata)
    : metadata_(std::move(metadata)) {
  const fs::path dir = config.data.dir;
  const data::TokenFileOptions options = file_options(config, metadata_);
  train_file_ = data::TokenFile(dir / config.data.train_file, options);
  val_file_ = data::TokenFile(dir / config.data.val_file, options);
  if (config.data.format == DataFormat::meshtrain) {
    check_token_counts(metadata_, train_file_, val_file_);
  } else {
    metadata_.token_dtype = train_file_.dtype();
    metadata_.train_tokens = train_file_.size();
    metadata_.val_tokens = val_file_.size();
  }
  const std::int64_t global_batch = global_batch_of(config);
  const auto seed = static_cast<std::uint64_t>(config.training.seed);
  const data::SampleOrder order = sample_order(config.data.sampler);
  train_sampler_ = std::make_unique<data::GlobalBatchSampler>(train_file_, config.model.block_size,
                                                              global_batch, seed, "train", order);
  val_sampler_ = std::make_unique<data::GlobalBatchSampler>(val_file_, config.model.block_size,
                                                            global_batch, seed, "val", order);
}

}  // namespace meshtrain
