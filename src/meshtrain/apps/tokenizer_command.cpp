// `meshtrain tokenizer train|encode|decode`: SentencePiece training, and a look at the ids
// any tokenizer gives (used by the tests and handy when preparing data).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <memory>
#include <vector>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/data/sentencepiece_tokenizer.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {
namespace {

std::unique_ptr<data::Tokenizer> open_named(const std::string& name) {
  if (name == "char") {
    throw ConfigError("the command line", {{"--tokenizer", name, "needs a corpus",
                                            "use gpt2, a GPT-2 directory or a .model file"}});
  }
  return data::open_tokenizer(name);
}

}  // namespace

int run_tokenizer_train(const TokenizerArgs& args) {
  return run_with_exit_codes("tokenizer train", [&] {
    data::SentencePieceTrainArgs train;
    train.inputs.assign(args.inputs.begin(), args.inputs.end());
    train.model_type = args.model_type;
    train.vocab_size = args.vocab_size;
    train.character_coverage = args.character_coverage;
    train.out_dir = args.out_dir;
    const std::filesystem::path model = data::train_sentencepiece(train);
    fmt::print("trained a {} SentencePiece model of {} pieces → {}\n", args.model_type,
               args.vocab_size, model.string());
    return 0;
  });
}

int run_tokenizer_encode(const TokenizerArgs& args) {
  return run_with_exit_codes("tokenizer encode", [&] {
    std::vector<std::int32_t> ids;
    open_named(args.tokenizer)->encode(args.text, ids);
    fmt::print("{}\n", fmt::join(ids, " "));
    return 0;
  });
}

int run_tokenizer_decode(const TokenizerArgs& args) {
  return run_with_exit_codes("tokenizer decode", [&] {
    std::vector<std::int32_t> ids;
    const char* at = args.text.data();
    const char* end = at + args.text.size();
    while (at < end) {
      if (*at == ' ') {
        ++at;
        continue;
      }
      std::int32_t id = 0;
      const auto [next, ec] = std::from_chars(at, end, id);
      if (ec != std::errc() || (next < end && *next != ' ')) {
        throw ConfigError("the command line",
                          {{"ids", args.text, "must be integers separated by spaces",
                            "pass e.g. \"15496 11 995\""}});
      }
      ids.push_back(id);
      at = next;
    }
    fmt::print("{}", open_named(args.tokenizer)->decode(ids));
    return 0;
  });
}

}  // namespace meshtrain
