#include "meshtrain/train/train_data.h"

#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"

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

// data.tokenizer opened; a bad name or file is the DataError of open_tokenizer (naming the
// file) with the setting and where relative paths start.
std::unique_ptr<data::Tokenizer> open_data_tokenizer(const Config& config) {
  try {
    return data::open_tokenizer(config.data.tokenizer);
  } catch (const DataError& e) {
    std::error_code ec;
    throw DataError(
        fmt::format("{}\n  data.tokenizer = \"{}\" (relative paths start at the "
                    "current directory, {})",
                    e.what(), config.data.tokenizer, fs::current_path(ec).string()));
  }
}

// How `named` differs from `own` (the data's), or "" when they are the same tokenizer as far as
// the ids go: kind, size, end-of-text id and the text of every id.
std::string tokenizer_difference(const data::Tokenizer& named, const data::Tokenizer& own) {
  if (named.kind() != own.kind()) {
    return fmt::format("it is a {} tokenizer, the data's is {}",
                       data::tokenizer_kind_name(named.kind()),
                       data::tokenizer_kind_name(own.kind()));
  }
  if (named.vocab_size() != own.vocab_size()) {
    return fmt::format("it has {} ids, the data's {}", named.vocab_size(), own.vocab_size());
  }
  if (named.eot_id() != own.eot_id()) return "its end-of-text id differs from the data's";
  for (std::int32_t id = 0; id < named.vocab_size(); ++id) {
    const std::span<const std::int32_t> one(&id, 1);
    if (named.decode(one) != own.decode(one)) {
      return fmt::format("id {} is another text in it than in the data's", id);
    }
  }
  return "";
}

// The dataset's own tokenizer, opened before any allocation: the final checkpoint copies its
// files and sample/export read them, so a missing or garbage file, or one whose kind, file
// names or vocab_size differ from meta.json's, is load_tokenizer's DataError (naming the file)
// now rather than after the last step.
std::unique_ptr<data::Tokenizer> open_own_tokenizer(const Config& config,
                                                    const data::Metadata& meta) {
  try {
    return data::load_tokenizer(meta, config.data.dir);
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}\n  data.dir = {} (its meta.json names this tokenizer)",
                                e.what(), config.data.dir));
  }
}

// data.tokenizer beside a meta.json names what the user expects the data to be: a check only,
// the ids are meta.json's tokenizer's either way.
void check_named_tokenizer(const Config& config, const data::Metadata& meta,
                           const data::Tokenizer& own) {
  if (config.data.tokenizer.empty()) return;
  const std::unique_ptr<data::Tokenizer> named = open_data_tokenizer(config);
  const std::string difference = tokenizer_difference(*named, own);
  if (difference.empty()) return;
  throw ConfigError(
      config.source,
      {{"data.tokenizer", fmt::format("\"{}\"", config.data.tokenizer),
        fmt::format("must be the tokenizer of {}'s meta.json ({}, {} ids): {}", config.data.dir,
                    data::tokenizer_kind_name(meta.tokenizer), meta.vocab_size, difference),
        "set data.tokenizer = \"\" (meta.json's tokenizer is used), or point "
        "data.dir at data prepared with this tokenizer"}});
}

// nanoGPT's and llm.c's files come without a meta.json: the vocabulary is data.tokenizer's or,
// without one, model.vocab_size (validation requires one of them); the token counts and width
// are the files' (TrainData).
RunMetadata foreign_metadata(Config& config) {
  RunMetadata run;
  data::Metadata& meta = run.metadata;
  meta.sources = {(fs::path(config.data.dir) / config.data.train_file).string(),
                  (fs::path(config.data.dir) / config.data.val_file).string()};
  if (config.data.tokenizer.empty()) {
    meta.vocab_size = config.model.vocab_size;
    return run;
  }
  run.tokenizer = open_data_tokenizer(config);
  const data::Tokenizer& tok = *run.tokenizer;
  meta.tokenizer = tok.kind();
  meta.tokenizer_files = tok.file_names();
  meta.vocab_size = tok.vocab_size();
  meta.eot_id = tok.eot_id();
  if (config.model.vocab_size == 0) {
    config.model.vocab_size = meta.vocab_size;
  } else if (config.model.vocab_size < meta.vocab_size) {
    throw ConfigError(
        config.source,
        {{"model.vocab_size", std::to_string(config.model.vocab_size),
          fmt::format("must be ≥ the {} ids of data.tokenizer = \"{}\" (a larger value pads the "
                      "embedding, as nanoGPT's 50304 for GPT-2)",
                      meta.vocab_size, config.data.tokenizer),
          fmt::format("set model.vocab_size = 0 to take {} from the tokenizer", meta.vocab_size)}});
  }
  return run;
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

// One sequence of model.block_size tokens needs one token more, its last target: a shorter
// file is a config that does not fit the data, named as such (the sampler's own check speaks
// of its seq_len argument).
void check_fits_one_sequence(const Config& config, const data::TokenFile& file,
                             std::string_view split) {
  const std::int64_t block = config.model.block_size;
  if (file.size() >= block + 1) return;
  const std::string fix =
      file.size() >= 2 ? fmt::format("lower model.block_size to at most {}, or use a larger corpus",
                                     file.size() - 1)
                       : std::string("use a larger corpus");
  throw DataError(fmt::format(
      "model.block_size = {}: the {} split's token file '{}' holds {} tokens, fewer than "
      "model.block_size + 1 = {} (one sequence and the next token of each of its positions); "
      "{}{}",
      block, split, file.path().string(), file.size(), block + 1, fix,
      split == "val" && config.data.format == DataFormat::meshtrain
          ? " (or prepare the data with a larger --val-fraction)"
          : ""));
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

RunMetadata load_run_metadata(Config& config) {
  if (config.data.format != DataFormat::meshtrain) return foreign_metadata(config);
  RunMetadata run{.metadata = load_data_metadata(config.data.dir), .tokenizer = nullptr};
  resolve_vocab(config, run.metadata);
  check_named_tokenizer(config, run.metadata, *open_own_tokenizer(config, run.metadata));
  return run;
}

TrainData::TrainData(const Config& config, RunMetadata metadata)
    : metadata_(std::move(metadata.metadata)),
      tokenizer_(std::move(metadata.tokenizer)),
      foreign_(config.data.format != DataFormat::meshtrain) {
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
    // meta.json's "the last share of the tokens that is val", here the files' share.
    metadata_.val_fraction = static_cast<double>(metadata_.val_tokens) /
                             static_cast<double>(metadata_.train_tokens + metadata_.val_tokens);
  }
  check_fits_one_sequence(config, train_file_, "train");
  check_fits_one_sequence(config, val_file_, "val");
  const std::int64_t global_batch = global_batch_of(config);
  const auto seed = static_cast<std::uint64_t>(config.training.seed);
  const data::SampleOrder order = sample_order(config.data.sampler);
  train_sampler_ = std::make_unique<data::GlobalBatchSampler>(train_file_, config.model.block_size,
                                                              global_batch, seed, "train", order);
  val_sampler_ = std::make_unique<data::GlobalBatchSampler>(val_file_, config.model.block_size,
                                                            global_batch, seed, "val", order);
}

void TrainData::write_tokenizer(const fs::path& dir) const {
  if (!tokenizer_) {
    // A meta.json an earlier run left there would describe another model's ids.
    std::error_code ec;
    if (foreign_) fs::remove(dir / data::kMetaJsonName, ec);
    return;
  }
  // The files first, so the checkpoint's meta.json never names a missing file.
  tokenizer_->save_files(dir);
  const std::string json = data::metadata_to_json(metadata_);
  StagedFile(dir / data::kMetaJsonName, std::as_bytes(std::span<const char>(json))).commit();
}

}  // namespace meshtrain
