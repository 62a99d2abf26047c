#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/checkpoint/model_checkpoint.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/model/causal_lm.h"

namespace meshtrain {
namespace {

// A bound that keeps a typo (an extra digit or three) from running for hours.
constexpr std::int64_t kMaxTokens = 1'000'000;

// Index drawn from softmax(logits / temperature) restricted to the top_k largest logits, with
// the uniform number u in [0, 1) (nanoGPT's sample.py rule, counter-based randomness).
std::int32_t draw(std::span<const float> logits, double temperature, std::int64_t top_k, double u) {
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  const std::size_t k = top_k > 0
                            ? std::min<std::size_t>(static_cast<std::size_t>(top_k), order.size())
                            : order.size();
  const double max_logit = logits[static_cast<std::size_t>(order[0])];
  std::vector<double> weights(k);
  for (std::size_t i = 0; i < k; ++i) {
    weights[i] = std::exp((logits[static_cast<std::size_t>(order[i])] - max_logit) / temperature);
  }
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  double acc = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    acc += weights[i] / total;
    if (u < acc) return order[i];
  }
  return order[k - 1];
}

// Prints the text of a growing id sequence as it grows. The byte-level tokenizers' text is the
// concatenation of their tokens' bytes; SentencePiece's decoding depends on neighbours (the
// leading-space marker), so its text is decoded whole and the new suffix printed.
class TextPrinter {
 public:
  TextPrinter(const data::Tokenizer& tokenizer, std::vector<std::int32_t> prompt)
      : tokenizer_(tokenizer), ids_(std::move(prompt)) {
    printed_ = tokenizer_.decode(ids_);
    print(printed_);
  }

  void add(std::int32_t id) {
    ids_.push_back(id);
    if (tokenizer_.kind() != data::TokenizerKind::sentencepiece) {
      return print(tokenizer_.decode(std::span<const std::int32_t>(&id, 1)));
    }
    const std::string text = tokenizer_.decode(ids_);
    if (text.size() > printed_.size() && text.starts_with(printed_)) {
      print(std::string_view(text).substr(printed_.size()));
      printed_ = text;
    }
  }

 private:
  static void print(std::string_view text) {
    fmt::print("{}", text);
    std::fflush(stdout);
  }

  const data::Tokenizer& tokenizer_;
  std::vector<std::int32_t> ids_;
  std::string printed_;
};

// The meta.json that describes the checkpoint's tokenizer: the checkpoint's own (a final
// checkpoint carries a copy), else — a sharded checkpoints/step-N directory carries none — the
// one its run's final checkpoint wrote (checkpoint.dir), else the dataset's (data.dir, the
// format meshtrain prepares). Relative directories start at the current directory, as they
// did for the run. Throws DataError listing the places tried.
std::filesystem::path tokenizer_metadata(const std::filesystem::path& dir, const Config& config) {
  std::vector<std::filesystem::path> candidates{dir / data::kMetaJsonName};
  if (!config.checkpoint.dir.empty()) {
    candidates.push_back(std::filesystem::path(config.checkpoint.dir) / data::kMetaJsonName);
  }
  if (config.data.format == DataFormat::meshtrain) {
    candidates.push_back(std::filesystem::path(config.data.dir) / data::kMetaJsonName);
  }
  std::error_code ec;
  for (const std::filesystem::path& path : candidates) {
    if (!std::filesystem::exists(path, ec)) continue;
    if (path != candidates.front()) {
      fmt::print(stderr, "meshtrain sample: {} has no {}; the tokenizer is {}'s\n", dir.string(),
                 data::kMetaJsonName, path.string());
    }
    return path;
  }
  std::string tried;
  for (const std::filesystem::path& path : candidates) tried += "\n  " + path.string();
  throw DataError(fmt::format(
      "{}: no tokenizer description (meta.json) found; tried:{}\n  sample the run's final "
      "checkpoint (its checkpoint.dir), or copy the dataset's meta.json and tokenizer files "
      "into {}",
      dir.string(), tried, dir.string()));
}

}  // namespace

int run_sample(const SampleArgs& args) {
  return run_with_exit_codes("sample", [&] {
    std::vector<ConfigIssue> issues;
    if (!(args.temperature > 0.0) || !std::isfinite(args.temperature)) {
      issues.push_back({"--temperature", fmt::format("{}", args.temperature),
                        "must be a finite number > 0", "use e.g. 0.8"});
    }
    if (args.tokens < 0 || args.tokens > kMaxTokens) {
      issues.push_back({"--tokens", fmt::format("{}", args.tokens),
                        fmt::format("must lie in [0, {}]", kMaxTokens), "use e.g. 300"});
    }
    if (args.top_k < 0) {
      issues.push_back({"--top-k", fmt::format("{}", args.top_k),
                        "must be ≥ 0 (0 = the whole vocabulary)", "use e.g. 200"});
    }
    if (args.seed < 0) {
      issues.push_back({"--seed", fmt::format("{}", args.seed), "must be ≥ 0", "use e.g. 1337"});
    }
    if (!issues.empty()) throw ConfigError("the command line", std::move(issues));
    const std::filesystem::path dir = args.checkpoint;
    const LogicalModel logical = load_logical_model(dir);  // final or sharded, values checked
    const Config& config = logical.config;
    const std::filesystem::path meta_json = tokenizer_metadata(dir, config);
    const data::Metadata meta = data::load_metadata(meta_json);
    const std::unique_ptr<data::Tokenizer> tokenizer =
        data::load_tokenizer(meta, meta_json.parent_path());
    // A run on nanoGPT's or llm.c's files may give the model more rows than the tokenizer has
    // ids (a padded vocabulary, nanoGPT's 50304 for GPT-2's 50257; docs/data.md); otherwise
    // the sizes are equal.
    const bool padded = config.data.format != DataFormat::meshtrain &&
                        tokenizer->vocab_size() < config.model.vocab_size;
    if (tokenizer->vocab_size() != config.model.vocab_size && !padded) {
      throw DataError(
          fmt::format("{}: a tokenizer of {} ids, but the model was trained with a vocabulary "
                      "of {}: meta.json does not belong to this checkpoint",
                      meta_json.string(), tokenizer->vocab_size(), config.model.vocab_size));
    }
    const auto tp = single_rank_group("tp");  // the whole model in this process
    CausalLm model(config.model, 0, TensorParallel{*tp});
    load_model_parameters(logical.tensors, dir.string(), model.parameters());
    // A prompt the vocabulary cannot encode is a bad argument (exit 2), not a bad file.
    std::vector<std::int32_t> ids;
    try {
      tokenizer->encode(args.prompt, ids);
    } catch (const DataError& e) {
      throw ConfigError("the command line", {{"--prompt", args.prompt, e.what(),
                                              "use only characters of the training text"}});
    }
    if (ids.empty()) {
      throw ConfigError("the command line", {{"--prompt", "\"\"", "must not be empty",
                                              "pass e.g. --prompt \"ROMEO:\""}});
    }
    const std::uint64_t stream = stream_of("sample");
    const auto seed = static_cast<std::uint64_t>(args.seed);
    // Only the tokenizer's ids are drawn: the padding rows of a padded vocabulary are never a
    // target, but their logits are not -inf.
    const auto vocab = static_cast<std::size_t>(tokenizer->vocab_size());
    TextPrinter printer(*tokenizer, ids);  // printed as generated: a long sample shows progress
    for (std::int64_t i = 0; i < args.tokens; ++i) {
      const std::int64_t T =
          std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), config.model.block_size);
      const Tensor logits = model.logits(ids.data() + ids.size() - T, 1, T, MicroBatchContext{});
      const std::span<const float> last(logits.f32() + (T - 1) * config.model.vocab_size, vocab);
      const double u =
          static_cast<double>(philox_u64(seed, stream, static_cast<std::uint64_t>(i)) >> 11) *
          0x1.0p-53;
      ids.push_back(draw(last, args.temperature, args.top_k, u));
      printer.add(ids.back());
    }
    fmt::print("\n");
    return 0;
  });
}

}  // namespace meshtrain
