#include <fmt/format.h>

#include "meshtrain/apps/commands.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/prepare.h"

namespace meshtrain {

int run_prepare(const PrepareArgs& args) {
  try {
    const data::PrepareResult r = data::prepare_char_dataset(args.text, args.out_dir);
    fmt::print("prepared {}: vocab {} characters, {} train tokens, {} val tokens → {}\n", args.text,
               r.vocab_size, r.train_tokens, r.val_tokens, args.out_dir);
    return 0;
  } catch (const DataError& e) {
    fmt::print(stderr, "meshtrain prepare: {}\n", e.what());
    return 3;
  }
}

}  // namespace meshtrain
