#include "meshtrain/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/checkpoint/logical_tensors.h"
#include "meshtrain/checkpoint/model_checkpoint.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/core/system.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/placement.h"
#include "meshtrain/train/collective_verdict.h"
#include "meshtrain/train/moe_metrics.h"
#include "meshtrain/train/non_finite_report.h"
#include "meshtrain/train/tensorboard.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<WatchdogScope> start_watchdog(const Config& config, Watchdog& watchdog,
                                              ProcessGroup& world) {
  return std::make_unique<WatchdogScope>(
      watchdog, world, WatchdogOptions{
                 .timeout_s = config.parallel.comm_timeout_s,
                 .recorder_size = static_cast<std::size_t>(config.parallel.flight_recorder_size),
                 .on_expiry = {}});
}

// Ranks on one node share its memory. Needs model.vocab_size resolved.
void check_memory_or_throw(const Config& config, int local_ranks) {
  const std::int64_t available = available_memory_bytes() / std::max(1, local_ranks);
  if (auto issues = check_memory(config, available); !issues.empty()) {
    throw ConfigError(config.source, std::move(issues));
  }
}

// Fails before training, not after it, when the final checkpoint could not be written.
void check_writable_dir(const fs::path& dir, const std::string& source) {
  std::error_code ec;
  if (dir.empty()) {
    throw ConfigError(
        source,
        {{"checkpoint.dir", "\"\"", "must name a directory",
          "set checkpoint.dir, or checkpoint.save_final = false and checkpoint.interval = 0"}});
  }
  // Probe by creating what is missing and a file in it, then remove what the probe created:
  // a run that fails later must not leave an empty checkpoint directory behind.
  fs::path first_created;
  for (fs::path p = fs::absolute(dir, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    first_created = p;
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  const fs::path probe = dir / ".meshtrain_write_probe";
  std::ofstream out(probe);
  const bool ok = !ec && out.good();
  out.close();
  fs::remove(probe, ec);
  if (!first_created.empty()) fs::remove_all(first_created, ec);
  if (!ok) {
    throw ConfigError(source, {{"checkpoint.dir", dir.string(),
                                "must be a directory meshtrain can create and write",
                                "choose another checkpoint.dir, or checkpoint.save_final = false "
                                "and checkpoint.interval = 0"}});
  }
}

// An output file (--trace, --metrics) must be creatable before training starts; its folder is
// created if missing, and the probe leaves nothing behind.
void check_output_file(const std::string& path, const std::string& option) {
  if (path.empty()) return;
  std::error_code ec;
  const fs::path file(path);
  if (file.has_parent_path()) fs::create_directories(file.parent_path(), ec);
  const bool existed = fs::exists(file, ec);
  const bool ok = !fs::is_directory(file, ec) && std::ofstream(file, std::ios::app).good();
  if (!existed) fs::remove(file, ec);
  if (!ok) {
    throw ConfigError("the command line",
                      {{option, path,
                        "must be a file meshtrain can create and write (its folder is created "
                        "if missing)",
                        fmt::format("choose another path for {}", option)}});
  }
}

// The files only rank 0 writes are checked on rank 0, and every rank learns the verdict: a
// rank that stopped alone would leave the others waiting in the first collective.
void check_outputs(const Config& config, const TrainerOptions& options, ProcessGroup& world) {
  on_rank0_for_all(world, [&] {
    if (config.checkpoint.save_final || config.checkpoint.interval > 0) {
      check_writable_dir(config.checkpoint.dir, config.source);
    }
    // Where the sharded checkpoints go: every interval, and after a stop signal.
    if (config.checkpoint.save_final || config.checkpoint.interval > 0) {
      check_writable_dir(fs::path(config.checkpoint.dir) / "checkpoints", config.source);
    }
    check_output_file(options.trace_path, "--trace");
    check_output_file(options.metrics_path, "--metrics");
    check_tensorboard_dir(options.tensorboard_dir, "--tensorboard");
  });
}

// checkpoint.init_from: every rank checks the file's header against the model (names,
// shapes), rank 0 also every value; all ranks reach the same verdict before any allocation.
std::unique_ptr<HfImport> open_import(const Config& config, ProcessGroup& world) {
  std::unique_ptr<HfImport> import;
  if (config.checkpoint.init_from.empty()) return import;
  agree_on_data_errors(world, [&] {
    try {
      import = std::make_unique<HfImport>(config.checkpoint.init_from, config.model);
      if (world.rank() == 0) import->check_values();
    } catch (const DataError& e) {
      throw DataError(fmt::format("checkpoint.init_from: {}", e.what()));
    }
  });
  return import;
}

MeshShape mesh_shape(const ParallelConfig& p) {
  return {.pp = static_cast<int>(p.pp),
          .dp = static_cast<int>(p.dp),
          .cp = static_cast<int>(p.cp),
          .tp = static_cast<int>(p.tp),
          .ep = static_cast<int>(p.ep)};
}

int threads_per_rank(const Config& config, int local_ranks) {
  if (config.training.threads > 0) return static_cast<int>(config.training.threads);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_ranks));
}

// Σ of `value` over the pipeline stages (only the last one computes a loss; every tp rank of
// it the same) and over the grad_reduction_group (the replicas that saw other tokens).
double sum_over_stages_and_replicas(const DeviceMesh& mesh, double value) {
  mesh.group(Axis::pp).all_reduce_sum(std::span<double>(&value, 1));
  grad_reduction_group(mesh).all_reduce_sum(std::span<double>(&value, 1));
  return value;
}

// This rank's first non-empty gradient shard (empty when it holds none), where a non-finite
// gradient is injected.
std::span<float> first_grad(OptimizerShards& shards) {
  for (OptimizerShard& s : shards) {
    if (s.grad.numel() > 0) return s.grad.span_f32();
  }
  return {};
}

}  // namespace

Trainer::Trainer(Config config, ProcessGroup& world, TrainerOptions options)
    : config_(std::move(config)),
      options_(std::move(options)),
      world_(world),
      monitors_(std::make_unique<CommMonitors>(world)) {
  validate_or_throw(config_, world.size());
  check_environment_for_all(world);  // before any allocation, agreed by every rank
  faults_ = std::make_unique<FaultInjector>(config_.fault_injection, world.rank(),
                                            restart_count_from_env());
  // The world's groups (the mesh's are split from it) inherit the debug mode.
  world.set_debug_checks(config_.parallel.debug_collectives);
  // Every rank gets here with a valid config (validation is the same pure function on every
  // rank, the environment's verdict an agreed one), so the watchdog's collective start-up
  // cannot leave one rank behind.
  watchdog_ = start_watchdog(config_, monitors_->watchdog(), world);
  RunMetadata metadata = load_run_metadata(config_);  // resolves model.vocab_size
  check_memory_or_throw(config_, options_.local_ranks);
  data_ = std::make_unique<TrainData>(config_, std::move(metadata));
  check_outputs(config_, options_, world);
  const std::unique_ptr<HfImport> import = open_import(config_, world);

  // Everything above only read files; from here on memory is allocated.
  mesh_ = std::make_unique<DeviceMesh>(mesh_shape(config_.parallel), world);
  set_check_context(mesh_->describe());
  threads_ = threads_per_rank(config_, options_.local_ranks);
  kernels::set_num_threads(threads_);
  model_ = std::make_unique<ModelStage>(config_, *mesh_, data_->train(), data_->val());
  optim_ = std::make_unique<OptimizerState>(config_, *mesh_, model_->stage(), import.get());
  const ParallelConfig& p = config_.parallel;
  if (p.overlap_grad_reduce && !overlap_grad_reduce(p) && p.dp * p.cp > 1 && options_.log &&
      world.rank() == 0) {
    fmt::print(
        "note: parallel.overlap_grad_reduce is off under pp_schedule = zb_h1 (weight gradients "
        "are final only after the W passes); the dp buckets are reduced after backward\n");
  }
  if (import && options_.log && world.rank() == 0) {
    fmt::print("initialised the parameters from {} ({})\n", config_.checkpoint.init_from,
               import->summary());
  }
  report_ = std::make_unique<Reporting>(config_, options_, world, *mesh_, model_->tied_group(),
                                        model_->predicted_bubble());
  trace_ = std::make_unique<StepTrace>(options_.trace_path, options_.trace_steps, options_.log,
                                       monitors_->trace());
  model_->runner().set_clock(report_->clock());
  model_->runner().set_faults(faults_.get());
  resume();
}

Trainer::Gradients Trainer::compute_gradients(std::int64_t step) {
  model_->run_step(step, optim_->loss_scale());
  {
    const trace::Scope traced(trace::Kind::grad_reduce);
    optim_->reduce_gradients(model_->stage().tied_embeddings(), model_->tied_group());
  }
  const trace::Scope traced(trace::Kind::grad_norm);
  const double local_loss =
      model_->runner().loss_sum() / static_cast<double>(config_.training.accumulation);
  const double loss =
      sum_over_stages_and_replicas(*mesh_, local_loss) / grad_reduction_group(*mesh_).size();
  if (!std::isfinite(loss)) {
    // Every rank sees the summed loss, so every rank takes part in finding where it came from.
    throw TrainingDiverged(fmt::format(
        "non-finite loss {} at step {}; {}; nothing was updated", loss, step + 1,
        non_finite_loss_origin(world_, *mesh_, model_->stage().parameters(), *optim_, local_loss)));
  }
  faults_->after_grad_reduction(step + 1, first_grad(optim_->shards()));
  if (optim_->unscale_or_skip(world_)) {
    return {loss, std::numeric_limits<double>::quiet_NaN(), true};
  }
  const double norm = optim_->grad_norm();
  // Under ZeRO 0 each data-parallel rank sums the norm of its own replica of the gradients: a
  // replica that differs after the reduction (memory gone bad there, or [fault_injection]'s
  // value) would send its rank alone down the error path and the others on into the next
  // step's collectives, a hang. So the ranks agree first (ZeRO 1-3 sum one norm over all).
  const bool replicas = config_.parallel.zero_stage == 0 && grad_reduction_group(*mesh_).size() > 1;
  if (replicas ? on_any_rank(world_, !std::isfinite(norm)) : !std::isfinite(norm)) {
    // Every rank learns where the non-finite gradient first appeared (before the reductions
    // spread it), so every rank throws the same message.
    throw TrainingDiverged(fmt::format(
        "non-finite gradient norm {} at step {}; {}; nothing was updated — lower training.lr or "
        "check the data",
        std::isfinite(norm) ? std::string("on another rank (this rank's replica is finite)")
                            : fmt::format("{}", norm),
        step + 1, non_finite_grad_origin(world_, *mesh_, *optim_, step)));
  }
  return {loss, norm};
}

double Trainer::apply_update(std::int64_t step, double grad_norm) {
  const trace::Scope traced(trace::Kind::optimizer);
  return optim_->apply_update(step, grad_norm);
}

double Trainer::evaluate() {
  const trace::Scope traced(trace::Kind::eval);
  const TrainingConfig& t = config_.training;
  const double sum = sum_over_stages_and_replicas(*mesh_, model_->evaluate_sum(t.eval_batches));
  return sum /
         static_cast<double>(t.eval_batches * t.accumulation * grad_reduction_group(*mesh_).size());
}

StepMetrics Trainer::train_step(std::int64_t step) {
  const TrainingConfig& t = config_.training;
  faults_->at_step_start(step + 1);
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t misses0 = TrackedAllocator::instance().misses();
  const std::int64_t faults0 = process_minor_faults();
  trace_->open_window();  // the window of the metrics' comm bytes
  const CommSnapshot comm_before = comm_snapshot(*mesh_, model_->stage().attention_core_seconds());
  const double loss_scale = optim_->loss_scale();  // what this step's backward uses
  const double comm0 = report_->comm_seconds();
  const Gradients g = compute_gradients(step);
  StepMetrics m;
  m.step = step + 1;
  m.epoch = data_->train().epochs_after(m.step * global_batch_of(config_));
  m.loss = g.loss;
  m.grad_norm = g.grad_norm;
  m.skipped = g.skipped;
  m.loss_scale = loss_scale;
  m.lr = report_->time_optimizer([&] { return apply_update(step, g.grad_norm); });
  report_->end_step(comm0);
  m.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.allocator_misses = TrackedAllocator::instance().misses() - misses0;
  m.minor_faults = process_minor_faults() - faults0;
  const double tokens_per_step =
      static_cast<double>(global_batch_of(config_) * config_.model.block_size);
  const double peak_flops =
      t.peak_flops_per_core * threads_ * static_cast<double>(mesh_->shape().world_size());
  m.tokens_per_s = tokens_per_step / m.step_time_s;
  m.mfu = m.tokens_per_s * model_->stage().flops_per_token(config_.model.block_size) / peak_flops;
  m.bubble = model_->last_bubble();
  m.peak_bytes = TrackedAllocator::instance().total().peak_bytes;
  set_comm_metrics(comm_before, comm_snapshot(*mesh_, model_->stage().attention_core_seconds()), m);
  m.dp_comm_exposed_s = optim_->dp_exposed_seconds();
  trace_->close_window();
  // After the step's counters: the metrics' own reductions are not the step's traffic.
  m.moe = collect_moe_metrics(model_->stage(), *mesh_, config_.model,
                              config_.parallel.sequence_parallel);
  if (t.straggler_interval > 0 && (step + 1) % t.straggler_interval == 0) {
    m.straggler_report = true;
    m.stragglers = report_->straggler_report(model_->runner().phases());
  }
  return m;
}

int Trainer::agreed_stop_signal() {
  // A signal reaches the ranks at different moments (mpirun forwards it one rank after the
  // other), or only one rank (`kill` of one pid): the max makes every rank stop after the
  // same step. 4 bytes once per step: µs against a step of ms or more (docs/resilience.md).
  std::int32_t sig = stop_signal_received();
  world_.all_reduce_max(std::span<std::int32_t>(&sig, 1));
  return sig;
}

std::vector<StepMetrics> Trainer::run() {
  const TrainingConfig& t = config_.training;
  std::vector<StepMetrics> history;
  report_->start_clock();
  trace_->start(world_);
  for (std::int64_t step = start_step_; step < t.max_steps; ++step) {
    trace_->begin_step(step);
    StepMetrics m = train_step(step);
    const bool last = step + 1 == t.max_steps;
    if (last || (t.eval_interval > 0 && (step + 1) % t.eval_interval == 0)) {
      m.val_loss = evaluate();
    }
    const std::int64_t interval = config_.checkpoint.interval;
    const bool saved = interval > 0 && ((step + 1) % interval == 0 || last);
    if (saved) {
      const trace::Scope traced(trace::Kind::checkpoint);
      save_checkpoint(step + 1);
      m.checkpoint_s = last_checkpoint_s_;
    }
    trace_->end_step();
    report_->log_step(m);
    history.push_back(m);
    // Outside the step's window, so its counters and trace hold only the step's traffic.
    if (const int sig = agreed_stop_signal(); sig != 0) {
      stop_for_signal(sig, step + 1, saved);
      break;
    }
  }
  finish_checkpoint();  // the last save is complete before run() returns
  trace_->write(world_, mesh_->shape());
  report_->report_peak_memory();
  report_->finish_run();
  // A stopped run is resumed, not finished: the consolidated copy would cost the grace
  // period a preempted job has, and the run that completes writes it.
  if (config_.checkpoint.save_final && !stopped_) {
    const std::vector<NamedTensor> tensors = logical_tensors();
    if (mesh_->rank() == 0) {
      // nanoGPT's and llm.c's data have no meta.json to copy: with data.tokenizer, one is
      // written for them.
      const fs::path meta_json = config_.data.format == DataFormat::meshtrain
                                     ? fs::path(config_.data.dir) / data::kMetaJsonName
                                     : fs::path();
      save_model_checkpoint(config_.checkpoint.dir, tensors, config_, meta_json);
      data_->write_tokenizer(config_.checkpoint.dir);
      if (options_.log) fmt::print("saved checkpoint to {}\n", config_.checkpoint.dir);
    }
  }
  return history;
}

std::vector<NamedTensor> Trainer::logical_tensors() {
  auto& zero = optim_->zero();
  return gather_logical_tensors(model_->stage().parameters(),
                                [&zero](const Parameter& p) { return zero.gather_master(p); },
                                *mesh_);
}

}  // namespace meshtrain
