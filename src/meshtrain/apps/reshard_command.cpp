#include <fmt/format.h>

#include "meshtrain/apps/command_errors.h"
#include "meshtrain/apps/commands.h"
#include "meshtrain/checkpoint/reshard.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

int run_reshard(const ReshardArgs& args) {
  return run_with_exit_codes("reshard", [&] {
    Config target = CheckpointReader(args.checkpoint).config();
    const std::vector<Override> overrides = parse_overrides(args.overrides);
    target =
        load_config_text(to_toml(target), "the checkpoint's config with the overrides", overrides);
    const auto dir = reshard_checkpoint(args.checkpoint, target, args.out_root);
    const ParallelConfig& p = target.parallel;
    fmt::print("wrote {} for dp={} cp={} ep={} tp={} pp={} v={} zero_stage={} ({} ranks)\n",
               dir.string(), p.dp, p.cp, p.ep, p.tp, p.pp, p.virtual_stages, p.zero_stage,
               p.dp * p.cp * p.tp * p.pp);
    return 0;
  });
}

}  // namespace meshtrain
