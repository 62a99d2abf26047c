#include <fmt/format.h>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/prepare.h"

namespace meshtrain {

int run_prepare(const PrepareArgs& args) {
  return run_with_exit_codes("prepare", [&] {
    data::PrepareOptions options;
    options.inputs.assign(args.texts.begin(), args.texts.end());
    options.out_dir = args.out_dir;
    options.tokenizer = args.tokenizer;
    options.val_fraction = args.val_fraction;
    options.document_separator = args.document_separator;
    options.progress = !args.quiet;
    const data::PrepareResult r = data::prepare_dataset(options);
    fmt::print(
        "prepared {} ({} bytes) with tokenizer {}: vocab {}, {} train tokens, {} val tokens "
        "({}) → {}\n",
        args.texts.size() == 1 ? args.texts[0] : fmt::format("{} files", args.texts.size()),
        r.text_bytes, args.tokenizer, r.vocab_size, r.train_tokens, r.val_tokens,
        data::token_dtype_name(r.token_dtype), args.out_dir);
    return 0;
  });
}

}  // namespace meshtrain
