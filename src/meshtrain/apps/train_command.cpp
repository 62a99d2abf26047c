#include <fmt/format.h>

#include "meshtrain/apps/commands.h"
#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/exit_codes.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

// One line a user (or a job script grepping for it) can act on.
void print_stop(const Trainer::Stop& stop, const Config& config) {
  const std::string who = stop.ranks_signalled == 1 ? fmt::format("rank {}", stop.first_rank)
                                                    : fmt::format("{} ranks", stop.ranks_signalled);
  const std::string saved =
      stop.checkpoint.empty()
          ? std::string(
                "no checkpoint written (checkpoint.save_final = false and "
                "checkpoint.interval = 0)")
          : fmt::format(
                "checkpoint written to {}; resume with --checkpoint.resume auto "
                "(checkpoint.dir = {})",
                stop.checkpoint.string(), config.checkpoint.dir);
  fmt::print(stderr,
             "meshtrain: received {} ({}) at step {}; every rank stopped after it; {}; "
             "exit code {}\n",
             signal_name(stop.signal), who, stop.step, saved, kExitStoppedBySignal);
  std::fflush(stderr);
}

}  // namespace

int run_train(const TrainArgs& args, const MpiRuntime& runtime) {
  const bool rank0 = runtime.world_rank() == 0;
  // No page faults per step from malloc giving memory back (allocator.h). Where malloc ignores
  // the settings (AddressSanitizer) the run is only slower, so the result is not checked.
  keep_freed_heap_memory();
  try {
    Config config = load_config_file(args.config, parse_overrides(args.overrides));
    const auto world = runtime.world_group();
    Trainer trainer(std::move(config), *world,
                    {.metrics_path = args.metrics,
                     .trace_path = args.trace,
                     .tensorboard_dir = args.tensorboard,
                     .trace_steps = args.trace_steps,
                     .log = true,
                     .local_ranks = runtime.local_size()});
    if (rank0) {
      const Config& c = trainer.config();
      fmt::print(
          "meshtrain: {} ({}{}) on {} rank(s) (dp={} tp={}{} pp={}{}{}{}), {} parameters, global "
          "batch {} × {} tokens\n",
          args.config, to_string(c.model.family),
          c.model.moe_experts > 0
              ? fmt::format(", MoE {} experts top-{}{}", c.model.moe_experts, c.model.moe_top_k,
                            c.model.moe_capacity_factor > 0.0
                                ? fmt::format(" capacity {:g}", c.model.moe_capacity_factor)
                                : " dropless")
              : "",
          runtime.world_size(), c.parallel.dp, c.parallel.tp,
          c.parallel.sequence_parallel && c.parallel.tp > 1 ? " +sp" : "", c.parallel.pp,
          c.parallel.pp > 1 ? fmt::format(" {} v={} m={}", to_string(c.parallel.pp_schedule),
                                          c.parallel.virtual_stages, c.training.accumulation)
                            : "",
          c.parallel.cp > 1 ? fmt::format(" cp={} {}", c.parallel.cp, to_string(c.parallel.cp_comm))
                            : "",
          c.parallel.ep > 1 ? fmt::format(" ep={}", c.parallel.ep) : "",
          trainer.logical_parameters(),
          c.training.micro_batch * c.training.accumulation * c.parallel.dp, c.model.block_size);
    }
    if (rank0 && trainer.config().parallel.sequence_parallel && trainer.config().parallel.tp == 1) {
      fmt::print("note: parallel.sequence_parallel has no effect with parallel.tp = 1\n");
    }
    trainer.run();
    if (const auto& stop = trainer.stopped()) {
      if (rank0) print_stop(*stop, trainer.config());
      return kExitStoppedBySignal;
    }
    return 0;
  } catch (const ConfigError& e) {
    // Every rank reaches the same verdict from the same files, so only rank 0 speaks.
    if (rank0) fmt::print(stderr, "meshtrain: {}", e.what());
    return 2;
  } catch (const DataError& e) {
    if (rank0) fmt::print(stderr, "meshtrain: {}\n", e.what());
    return 3;
  } catch (const TrainingDiverged& e) {
    // Every rank saw the same reduced value and stops; one message says it.
    if (rank0) fmt::print(stderr, "meshtrain: {}\n", e.what());
    return 1;
  } catch (const Error& e) {
    fmt::print(stderr, "meshtrain: {}\n", e.what());  // runtime errors name their rank
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr,
               "meshtrain: rank {} ran out of memory; reduce the model or training.micro_batch\n",
               runtime.world_rank());
    return 1;
  }
}

}  // namespace meshtrain
