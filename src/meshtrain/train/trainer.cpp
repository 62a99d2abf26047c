#include "meshtrain/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/checkpoint/model_checkpoint.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/core/system.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/layers/context_attention.h"
#include "meshtrain/parallel/pp/simulator.h"
#include "meshtrain/parallel/tp/gather.h"
#include "meshtrain/train/collective_verdict.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// Vocabulary size comes from the data unless the config sets it; a mismatch is a config error.
void resolve_vocab(Config& config, const data::Metadata& meta) {
  const std::int64_t data_vocab = meta.vocab.size();
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

// Fails before training, not after it, when the final checkpoint could not be written.
void check_writable_dir(const fs::path& dir, const std::string& source) {
  std::error_code ec;
  if (dir.empty()) {
    throw ConfigError(source, {{"checkpoint.dir", "\"\"", "must name a directory",
                                "set checkpoint.dir, or checkpoint.save_final = false"}});
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
    throw ConfigError(
        source,
        {{"checkpoint.dir", dir.string(), "must be a directory meshtrain can create and write",
          "choose another checkpoint.dir, or checkpoint.save_final = false"}});
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

int threads_per_rank(const Config& config, int local_ranks) {
  if (config.training.threads > 0) return static_cast<int>(config.training.threads);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_ranks));
}

// Bytes and seconds of every operation of `group` so far.
CommCounter comm_total(const ProcessGroup& group) {
  CommCounter sum;
  for (std::size_t op = 0; op < kNumCommOps; ++op) {
    const CommCounter& c = group.counter(static_cast<CommOp>(op));
    sum.calls += c.calls;
    sum.bytes += c.bytes;
    sum.seconds += c.seconds;
  }
  return sum;
}

std::string mib(std::int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

}  // namespace

Trainer::Trainer(Config config, ProcessGroup& world, TrainerOptions options)
    : config_(std::move(config)), options_(std::move(options)), world_(world) {
  validate_or_throw(config_, world.size());
  ProcessGroup::set_debug_checks(config_.parallel.debug_collectives);
  // Every rank gets here with a valid config (validation is the same pure function on every
  // rank), so the watchdog's collective start-up cannot leave one rank behind.
  watchdog_ = std::make_unique<WatchdogScope>(
      world, WatchdogOptions{
                 .timeout_s = config_.parallel.comm_timeout_s,
                 .recorder_size = static_cast<std::size_t>(config_.parallel.flight_recorder_size),
                 .on_expiry = {}});
  const fs::path dir = config_.data.dir;
  metadata_ = load_data_metadata(dir);
  resolve_vocab(config_, metadata_);
  // Ranks on one node share its memory.
  const std::int64_t available = available_memory_bytes() / std::max(1, options_.local_ranks);
  if (auto issues = check_memory(config_, available); !issues.empty()) {
    throw ConfigError(config_.source, std::move(issues));
  }
  train_file_ = data::TokenFile(dir / data::kTrainBinName, metadata_.vocab.size());
  val_file_ = data::TokenFile(dir / data::kValBinName, metadata_.vocab.size());
  check_token_counts(metadata_, train_file_, val_file_);
  // The files only rank 0 writes are checked on rank 0, and every rank learns the verdict: a
  // rank that stopped alone would leave the others waiting in the first collective.
  on_rank0_for_all(world, [&] {
    if (config_.checkpoint.save_final || config_.checkpoint.interval > 0) {
      check_writable_dir(config_.checkpoint.dir, config_.source);
    }
    if (config_.checkpoint.interval > 0) {  // where the sharded checkpoints go
      check_writable_dir(fs::path(config_.checkpoint.dir) / "checkpoints", config_.source);
    }
    check_output_file(options_.trace_path, "--trace");
    check_output_file(options_.metrics_path, "--metrics");
    // A resumed run continues its metrics file: the steps it repeats appear twice, the
    // later line being the resumed run's.
    if (!options_.metrics_path.empty()) {
      metrics_.open(options_.metrics_path,
                    config_.checkpoint.resume.empty() ? std::ios::trunc : std::ios::app);
    }
  });
  // checkpoint.init_from: every rank checks the file's header against the model (names,
  // shapes), rank 0 also every value; all ranks reach the same verdict before any allocation.
  std::unique_ptr<HfImport> import;
  if (!config_.checkpoint.init_from.empty()) {
    agree_on_data_errors(world, [&] {
      try {
        import = std::make_unique<HfImport>(config_.checkpoint.init_from, config_.model);
        if (world.rank() == 0) import->check_values();
      } catch (const DataError& e) {
        throw DataError(fmt::format("checkpoint.init_from: {}", e.what()));
      }
    });
  }
  const std::int64_t global_batch = global_batch_of(config_);
  const auto seed = static_cast<std::uint64_t>(config_.training.seed);
  train_sampler_ = std::make_unique<data::GlobalBatchSampler>(train_file_, config_.model.block_size,
                                                              global_batch, seed, "train");
  val_sampler_ = std::make_unique<data::GlobalBatchSampler>(val_file_, config_.model.block_size,
                                                            global_batch, seed, "val");

  // Everything above only read files; from here on memory is allocated.
  const MeshShape shape{.pp = static_cast<int>(config_.parallel.pp),
                        .dp = static_cast<int>(config_.parallel.dp),
                        .cp = static_cast<int>(config_.parallel.cp),
                        .tp = static_cast<int>(config_.parallel.tp),
                        .ep = static_cast<int>(config_.parallel.ep)};
  mesh_ = std::make_unique<DeviceMesh>(shape, world);
  set_check_context(mesh_->describe());
  ProcessGroup& dp = mesh_->group(Axis::dp);
  ProcessGroup& cp = mesh_->group(Axis::cp);
  // Gradients are averaged, and ZeRO shards, over every rank that holds a replica of the
  // parameters: dp × cp (context parallel splits sequences, not weights).
  ProcessGroup& replicas = mesh_->dp_cp_group();
  threads_ = threads_per_rank(config_, options_.local_ranks);
  kernels::set_num_threads(threads_);

  ProcessGroup& tp = mesh_->group(Axis::tp);
  ProcessGroup& pp = mesh_->group(Axis::pp);
  const TrainingConfig& t = config_.training;
  const ParallelConfig& par = config_.parallel;
  {
    // The model is built without storage; ZeroSharding initialises what this rank keeps, so
    // no memory category ever peaks above its steady state (ZeRO-3: the model never has to fit
    // on one rank; 16-bit runs never hold fp32 copies of their parameters).
    const DeferParameterStorage defer;
    const ParallelGroups groups(
        TensorParallel{tp, par.sequence_parallel},
        ContextParallel{&cp, par.cp_comm == "a2a" ? CpComm::a2a : CpComm::p2p});
    stage_ = std::make_unique<PipelineStage>(config_, seed, groups, pp.rank());
  }
  const pp::ScheduleSpec schedule{.name = par.pp_schedule,
                                  .pp = static_cast<int>(par.pp),
                                  .v = static_cast<int>(par.virtual_stages),
                                  .m = static_cast<int>(t.accumulation)};
  executor_ = std::make_unique<pp::PipelineExecutor>(schedule, pp);
  predicted_bubble_ = pp::simulate(schedule).bubble_fraction;
  runner_ = std::make_unique<StageRunner>(*stage_, *train_sampler_,
                                          MicroBatching{.micro_batch = t.micro_batch,
                                                        .seq_len = config_.model.block_size,
                                                        .microbatches = t.accumulation,
                                                        .dp_rank = dp.rank(),
                                                        .dp_size = dp.size(),
                                                        .tp_size = tp.size(),
                                                        .sequence_parallel = par.sequence_parallel,
                                                        .cp_rank = cp.rank(),
                                                        .cp_size = cp.size()},
                                          *executor_);
  clock_ = PhaseClock([this] { return comm_seconds(); });
  runner_->set_clock(clock_);
  if (options_.slow_rank == world.rank()) {
    runner_->set_delay(options_.slow_phase, options_.slow_seconds);
  }
  if (pp.size() > 1 && config_.model.family == "gpt2") {
    // The first and last stage hold the tied embedding's two copies; split is collective over
    // pp, so the middle stages take part (and get a group of their own they never use).
    const bool ends = pp.rank() == 0 || pp.rank() == pp.size() - 1;
    tied_group_ = pp.split(ends ? 0 : 1, pp.rank(), "embedding");
  }
  const ParameterList& params = stage_->parameters();
  double count = 0.0;
  for (const Parameter* p : params) {
    if (!p->tied_copy) count += static_cast<double>(p->logical_numel());
  }
  pp.all_reduce_sum(std::span<double>(&count, 1));
  logical_parameters_ = static_cast<std::int64_t>(count);
  const DType compute = t.precision == "bf16"   ? DType::bf16
                        : t.precision == "fp16" ? DType::f16
                                                : DType::f32;
  ZeroOptions zero_options{.stage = static_cast<int>(par.zero_stage),
                           .compute_dtype = compute,
                           .bucket_bytes = par.bucket_mib << 20,
                           .seed = seed,
                           .initial_values = {}};
  if (import) {
    zero_options.initial_values = [source = import.get()](const Parameter& p, std::int64_t begin,
                                                          std::int64_t end, float* out) {
      source->fill(p, begin, end, out);
    };
  }
  zero_ = std::make_unique<ZeroSharding>(params, stage_->units(), replicas, zero_options);
  if (import && options_.log && world.rank() == 0) {
    fmt::print("initialised the parameters from {}\n", config_.checkpoint.init_from);
  }
  stage_->set_hooks(zero_.get());
  if (t.precision == "fp16") {
    scaler_ = std::make_unique<DynamicLossScaler>(
        LossScalerConfig{.initial_scale = t.loss_scale_init,
                         .growth_interval = t.loss_scale_growth_interval,
                         .growth = t.loss_scale_growth,
                         .backoff = t.loss_scale_backoff,
                         .hysteresis = t.loss_scale_hysteresis});
  }
  replicated_grads_ =
      std::make_unique<ReplicatedGradSum>(zero_->shards(), tp, par.sequence_parallel);
  optimizer_ = std::make_unique<AdamW>(
      zero_->shards(),
      AdamWConfig{
          .beta1 = t.beta1, .beta2 = t.beta2, .eps = t.eps, .weight_decay = t.weight_decay});
  const std::size_t micro_tokens =
      static_cast<std::size_t>(config_.training.micro_batch * config_.model.block_size);
  inputs_.resize(micro_tokens);
  targets_.resize(micro_tokens);
  resume();
}

Trainer::Gradients Trainer::compute_gradients(std::int64_t step) {
  const TrainingConfig& t = config_.training;
  ProcessGroup& dp = mesh_->dp_cp_group();  // every replica of the parameters
  ProcessGroup& pp = mesh_->group(Axis::pp);
  runner_->begin_step(step);
  runner_->set_loss_scale(scaler_ ? static_cast<float>(scaler_->scale()) : 1.0f);
  const double step_start_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const std::vector<pp::ExecutedAction> actions = executor_->run_step(*runner_);
  double busy = 0.0;
  for (const pp::ExecutedAction& a : actions) {
    const pp::ActionKind k = a.action.kind;
    if (k == pp::ActionKind::forward || k == pp::ActionKind::backward ||
        k == pp::ActionKind::backward_input || k == pp::ActionKind::backward_weight) {
      busy += a.end_s - a.start_s;
    }
  }
  // Idle = the step's pipeline time (the longest stage's action list: a stage that finished
  // early waits for it) minus this stage's compute; averaged over the stages.
  float span = actions.empty() ? 0.0f : static_cast<float>(actions.back().end_s);
  pp.all_reduce_max(std::span<float>(&span, 1));
  last_bubble_ = span > 0.0f ? 1.0 - busy / static_cast<double>(span) : 0.0;
  pp.all_reduce_sum(std::span<double>(&last_bubble_, 1));
  last_bubble_ /= pp.size();
  record_trace(step, step_start_s, actions);

  zero_->reduce_gradients();        // over dp × cp (stages 2, 3: done during backward)
  sum_tied_embeddings();            // gpt2 over stages: both copies get the summed gradient
  replicated_grads_->all_reduce();  // sequence parallel: partial sums over tp, once per step
  // The last stage computed the loss (every tp rank of it the same); average over dp × cp:
  // every cp rank's loss is the mean over the same number of tokens (T/cp per sequence), so
  // the mean of the means is the mean over the global batch's tokens.
  double loss = runner_->loss_sum() / static_cast<double>(t.accumulation);
  pp.all_reduce_sum(std::span<double>(&loss, 1));
  dp.all_reduce_sum(std::span<double>(&loss, 1));
  loss /= dp.size();
  if (!std::isfinite(loss)) {
    throw TrainingDiverged(
        fmt::format("{}: non-finite loss {} at step {}; nothing was updated — lower "
                    "training.lr or check the data",
                    mesh_->describe(), loss, step + 1));
  }
  OptimizerShards& shards = zero_->shards();
  if (step == options_.inject_inf_step && world_.rank() == options_.inject_inf_rank) {
    for (OptimizerShard& s : shards) {
      if (s.grad.numel() == 0) continue;
      s.grad.f32()[0] = options_.inject_value;
      break;
    }
  }
  const auto first_non_finite = [&shards]() -> const Parameter* {
    for (const OptimizerShard& s : shards) {
      const auto g = s.grad.span_f32();
      if (std::any_of(g.begin(), g.end(), [](float x) { return !std::isfinite(x); })) {
        return s.param;
      }
    }
    return nullptr;
  };
  if (scaler_) {
    // Every rank must skip the same step: the flag is the MAX over the whole world (seed 000,
    // §3.3), not over one group.
    float found = first_non_finite() != nullptr ? 1.0f : 0.0f;
    world_.all_reduce_max(std::span<float>(&found, 1));
    const float scale = static_cast<float>(scaler_->scale());
    last_skipped_ = scaler_->update(found > 0.0f);
    if (last_skipped_) return {loss, std::numeric_limits<double>::quiet_NaN(), true};
    for (OptimizerShard& s : shards)
      kernels::scale_inplace(s.grad.f32(), 1.0f / scale, s.grad.numel());
  }
  const double norm =
      global_grad_norm(shards, mesh_->group(Axis::tp), pp, zero_->stage() >= 1 ? &dp : nullptr);
  if (!std::isfinite(norm)) {
    // Every rank sees the same norm; all learn which rank holds the first non-finite gradient
    // and in which parameter, so the one message (rank 0's) names them.
    const Parameter* bad = first_non_finite();
    const std::string where = first_error(world_, bad ? bad->name : "");
    throw TrainingDiverged(fmt::format(
        "non-finite gradient norm {} at step {}; first non-finite gradient on {}; nothing was "
        "updated — lower training.lr or check the data",
        norm, step + 1, where.empty() ? "no rank (the norm itself overflowed)" : where));
  }
  return {loss, norm};
}

void Trainer::sum_tied_embeddings() {
  // On the optimizer shards' gradients: both copies have the same shape, so every dp rank
  // owns the same slice of each (ZeRO), and the sum of slices is the slice of the sum.
  std::vector<Tensor> grads;
  for (const Parameter* p : stage_->tied_embeddings()) {
    for (const OptimizerShard& s : zero_->shards()) {
      if (s.param == p) grads.push_back(s.grad);
    }
  }
  if (grads.empty()) return;
  Tensor& grad = grads.front();
  if (grads.size() == 2) kernels::add_inplace(grad.f32(), grads[1].f32(), grad.numel());
  if (tied_group_) tied_group_->all_reduce_sum(grad.span_f32());
  if (grads.size() == 2) grads[1].copy_from(grad);
}

double Trainer::apply_update(std::int64_t step, double grad_norm) {
  const TrainingConfig& t = config_.training;
  const std::int64_t decay_steps = t.lr_decay_steps > 0 ? t.lr_decay_steps : t.max_steps;
  const double lr = lr_at(step, scaled_peak_lr(config_), t.min_lr, t.warmup_steps, decay_steps);
  if (!last_skipped_) {
    clip_grads(zero_->shards(), grad_norm, t.grad_clip);
    optimizer_->step(lr);
    zero_->publish_parameters();
  }
  last_skipped_ = false;
  zero_->zero_grad();
  return lr;
}

double Trainer::evaluate() {
  // Forward only, one micro-batch at a time through the chunks in model order: the owner of
  // chunk g receives from the owner of g − 1 and sends to the owner of g + 1 (blocking; every
  // rank walks the chunks in the same order, so each send meets its receive).
  const TrainingConfig& t = config_.training;
  ProcessGroup& dp = mesh_->group(Axis::dp);
  ProcessGroup& cp = mesh_->group(Axis::cp);
  ProcessGroup& pp = mesh_->group(Axis::pp);
  const int chunks = stage_->num_global_chunks();
  const std::int64_t local_len = config_.model.block_size / cp.size();
  const std::int64_t tokens = t.micro_batch * local_len;
  const Shape boundary{
      config_.parallel.sequence_parallel ? tokens / mesh_->group(Axis::tp).size() : tokens,
      config_.model.n_embd};
  double sum = 0.0;
  for (std::int64_t b = 0; b < t.eval_batches; ++b) {
    for (std::int64_t a = 0; a < t.accumulation; ++a) {
      const std::int64_t first = data::first_sequence_of(a, dp.rank(), dp.size(), t.micro_batch);
      val_sampler_->fill(b, first, t.micro_batch, inputs_.data(), targets_.data());
      const std::vector<std::int32_t> inputs =
          zigzag_rows(inputs_, t.micro_batch, config_.model.block_size, cp.rank(), cp.size());
      const std::vector<std::int32_t> targets =
          zigzag_rows(targets_, t.micro_batch, config_.model.block_size, cp.rank(), cp.size());
      Tensor x;
      for (int g = 0; g < chunks; ++g) {
        const int owner = g % pp.size();
        if (owner != pp.rank()) continue;
        const int prev = (g + pp.size() - 1) % pp.size(), next = (g + 1) % pp.size();
        if (g > 0 && prev != pp.rank()) {
          x = Tensor::empty(boundary, MemCategory::activations);
          pp.recv(x.span_f32(), prev, g);
        }
        CausalLm& chunk = stage_->chunk(g / pp.size());
        x = chunk.forward_blocks(inputs.data(), x, t.micro_batch, local_len);
        if (g == chunks - 1) {
          sum += chunk.forward_head(x, targets.data());
        } else if (next != pp.rank()) {
          pp.send(x.span_f32(), next, g + 1);
        }
        chunk.discard();  // no backward follows: free this micro-batch's activations now
      }
    }
  }
  pp.all_reduce_sum(std::span<double>(&sum, 1));
  dp.all_reduce_sum(std::span<double>(&sum, 1));
  cp.all_reduce_sum(std::span<double>(&sum, 1));  // each cp rank: the mean of its T/cp tokens
  return sum / static_cast<double>(t.eval_batches * t.accumulation * dp.size() * cp.size());
}

std::vector<StepMetrics> Trainer::run() {
  const TrainingConfig& t = config_.training;
  const double tokens_per_step =
      static_cast<double>(global_batch_of(config_) * config_.model.block_size);
  const double peak_flops =
      t.peak_flops_per_core * threads_ * static_cast<double>(mesh_->shape().world_size());
  std::vector<StepMetrics> history;
  world_.barrier();  // a common time origin for the trace (one clock per machine)
  t0_ = std::chrono::steady_clock::now();
  for (std::int64_t step = start_step_; step < t.max_steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const CommCounter tp0 = comm_total(mesh_->group(Axis::tp));
    const CommCounter dp0 = dp_comm_total();
    const CommCounter cp0 = comm_total(mesh_->group(Axis::cp));
    const double attention0 = attention_core_compute_seconds();
    const double loss_scale = scaler_ ? scaler_->scale() : 1.0;  // what this step's backward uses
    const double comm0 = comm_seconds();
    const Gradients g = compute_gradients(step);
    StepMetrics m;
    m.step = step + 1;
    m.loss = g.loss;
    m.grad_norm = g.grad_norm;
    m.skipped = g.skipped;
    m.loss_scale = loss_scale;
    m.lr = clock_.time(Phase::optimizer, window_, [&] { return apply_update(step, g.grad_norm); });
    window_[Phase::comm_wait] += comm_seconds() - comm0;
    ++window_steps_;
    m.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    m.tokens_per_s = tokens_per_step / m.step_time_s;
    m.mfu = m.tokens_per_s * stage_->flops_per_token(config_.model.block_size) / peak_flops;
    m.bubble = last_bubble_;
    m.peak_bytes = TrackedAllocator::instance().total().peak_bytes;
    const CommCounter tp1 = comm_total(mesh_->group(Axis::tp));
    const CommCounter dp1 = dp_comm_total();
    const CommCounter cp1 = comm_total(mesh_->group(Axis::cp));
    m.tp_comm_bytes = tp1.bytes - tp0.bytes;
    m.dp_comm_bytes = dp1.bytes - dp0.bytes;
    m.cp_comm_bytes = cp1.bytes - cp0.bytes;
    m.cp_comm_s = cp1.seconds - cp0.seconds;
    m.attention_s = attention_core_compute_seconds() - attention0;
    m.tp_comm_s = tp1.seconds - tp0.seconds;
    m.dp_comm_s = dp1.seconds - dp0.seconds;
    if (t.straggler_interval > 0 && (step + 1) % t.straggler_interval == 0) {
      m.straggler_report = true;
      m.stragglers = straggler_report(window_steps_);
    }
    const bool last = step + 1 == t.max_steps;
    if (last || (t.eval_interval > 0 && (step + 1) % t.eval_interval == 0)) {
      m.val_loss = evaluate();
    }
    const std::int64_t interval = config_.checkpoint.interval;
    if (interval > 0 && ((step + 1) % interval == 0 || last)) {
      save_checkpoint(step + 1);
      m.checkpoint_s = last_checkpoint_s_;
    }
    log_step(m);
    history.push_back(m);
  }
  finish_checkpoint();  // the last save is complete before run() returns
  write_trace();
  report_peak_memory();
  if (config_.checkpoint.save_final) {
    const std::vector<NamedTensor> tensors = logical_tensors();
    if (mesh_->rank() == 0) {
      save_model_checkpoint(config_.checkpoint.dir, tensors, config_,
                            fs::path(config_.data.dir) / data::kMetaJsonName);
      if (options_.log) fmt::print("saved checkpoint to {}\n", config_.checkpoint.dir);
    }
  }
  return history;
}

std::vector<NamedTensor> Trainer::logical_tensors() {
  // Each tp group gathers its shards (a collective); then every pipeline stage in turn
  // broadcasts its tensors over the pp group — name, shape, values — so the first stage holds
  // the whole model. dp replicas are identical. (A sharded checkpoint, written by every rank,
  // replaces this in the checkpoint issue.)
  ProcessGroup& tp = mesh_->group(Axis::tp);
  ProcessGroup& pp = mesh_->group(Axis::pp);
  std::vector<NamedTensor> mine;
  for (const Parameter* p : stage_->parameters()) {
    // The fp32 master, gathered over dp (ZeRO) then over tp; every rank takes part.
    if (!p->tied_copy) mine.push_back({p->name, gather_logical(*p, zero_->gather_master(*p), tp)});
  }
  if (pp.size() == 1) return mine;
  std::vector<NamedTensor> all;
  for (int root = 0; root < pp.size(); ++root) {
    std::int64_t count = static_cast<std::int64_t>(mine.size());
    pp.broadcast(std::as_writable_bytes(std::span<std::int64_t>(&count, 1)), root);
    for (std::int64_t i = 0; i < count; ++i) {
      const bool own = root == pp.rank();
      std::string name = own ? mine[static_cast<std::size_t>(i)].name : std::string();
      Shape shape = own ? mine[static_cast<std::size_t>(i)].tensor.shape() : Shape{};
      std::int64_t header[2] = {static_cast<std::int64_t>(name.size()),
                                static_cast<std::int64_t>(shape.size())};
      pp.broadcast(std::as_writable_bytes(std::span<std::int64_t>(header)), root);
      name.resize(static_cast<std::size_t>(header[0]));
      shape.resize(static_cast<std::size_t>(header[1]));
      pp.broadcast(std::as_writable_bytes(std::span<char>(name)), root);
      pp.broadcast(std::as_writable_bytes(std::span<std::int64_t>(shape)), root);
      Tensor value =
          own ? mine[static_cast<std::size_t>(i)].tensor : Tensor::empty(shape, MemCategory::other);
      pp.broadcast(std::as_writable_bytes(value.span_f32()), root);
      all.push_back({std::move(name), std::move(value)});
    }
  }
  return all;
}

CommCounter Trainer::dp_comm_total() const {
  // Under cp the gradient reduction runs over dp × cp: reported as the dp traffic.
  CommCounter sum = comm_total(mesh_->group(Axis::dp));
  if (&mesh_->dp_cp_group() == &mesh_->group(Axis::dp)) return sum;
  const CommCounter dp_cp = comm_total(mesh_->dp_cp_group());
  sum.calls += dp_cp.calls;
  sum.bytes += dp_cp.bytes;
  sum.seconds += dp_cp.seconds;
  return sum;
}

double Trainer::comm_seconds() const {
  double s = 0.0;
  for (const Axis axis : {Axis::tp, Axis::dp, Axis::pp, Axis::cp})
    s += comm_total(mesh_->group(axis)).seconds;
  if (&mesh_->dp_cp_group() != &mesh_->group(Axis::dp))
    s += comm_total(mesh_->dp_cp_group()).seconds;
  if (tied_group_) s += comm_total(*tied_group_).seconds;
  return s;
}

std::vector<Straggler> Trainer::straggler_report(std::int64_t steps) {
  PhaseSeconds mine = window_;
  for (const Phase p : {Phase::data, Phase::forward, Phase::backward})
    mine[p] = runner_->phases()[p];
  std::vector<float> in(kNumPhases);
  for (std::size_t i = 0; i < kNumPhases; ++i) in[i] = static_cast<float>(mine.s[i]);
  std::vector<float> all(kNumPhases * static_cast<std::size_t>(world_.size()));
  world_.all_gather(in, all);
  std::vector<PhaseSeconds> per_rank(static_cast<std::size_t>(world_.size()));
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    for (std::size_t i = 0; i < kNumPhases; ++i) per_rank[r].s[i] = all[r * kNumPhases + i];
  }
  window_ = {};
  runner_->phases() = {};
  window_steps_ = 0;
  return find_stragglers(per_rank, steps, config_.training.straggler_threshold);
}

void Trainer::report_peak_memory() {
  // Every rank's peak per category reaches rank 0 (one broadcast per rank over the world): the
  // stages of a pipeline, and tp shards with padding, hold different amounts.
  std::array<std::int64_t, kNumMemCategories + 1> mine{};
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    mine[c] = TrackedAllocator::instance().stats(static_cast<MemCategory>(c)).peak_bytes;
  }
  mine[kNumMemCategories] = TrackedAllocator::instance().total().peak_bytes;
  std::string table;
  for (int root = 0; root < world_.size(); ++root) {
    auto row = mine;
    world_.broadcast(std::as_writable_bytes(std::span<std::int64_t>(row)), root);
    const MeshCoords c = mesh_->shape().coords_of(root);
    table += fmt::format("  {:>4}  {:>2} {:>2} {:>2}", root, c.pp, c.dp, c.tp);
    for (std::int64_t bytes : row)
      table += fmt::format(" {:>11.2f}", static_cast<double>(bytes) / 1048576.0);
    table += "\n";
  }
  if (world_.rank() != 0 || !options_.log) return;
  std::string header = "  rank  pp dp tp";
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    header += fmt::format(" {:>11}", to_string(static_cast<MemCategory>(c)));
  }
  fmt::print("peak memory per rank (MiB, tracked allocator):\n{} {:>11}\n{}", header, "total",
             table);
}

void Trainer::record_trace(std::int64_t step, double offset,
                           const std::vector<pp::ExecutedAction>& actions) {
  // Times relative to t0_ (after the barrier in run(), one clock per machine); outside run()
  // (tests call compute_gradients directly) there is no origin and nothing is recorded.
  if (options_.trace_path.empty() || step >= options_.trace_steps) return;
  if (t0_ == std::chrono::steady_clock::time_point{}) return;
  for (const pp::ExecutedAction& a : actions) {
    trace_.insert(trace_.end(),
                  {static_cast<double>(step), static_cast<double>(a.action.kind),
                   static_cast<double>(a.action.microbatch), static_cast<double>(a.action.chunk),
                   static_cast<double>(a.action.peer), offset + a.start_s, offset + a.end_s});
  }
}

void Trainer::write_trace() {
  if (options_.trace_path.empty()) return;
  // Every rank's records reach rank 0 (one broadcast per rank over the world).
  constexpr std::size_t kFields = 7;
  nlohmann::json events = nlohmann::json::array();
  for (int root = 0; root < world_.size(); ++root) {
    std::int64_t n = static_cast<std::int64_t>(trace_.size());
    world_.broadcast(std::as_writable_bytes(std::span<std::int64_t>(&n, 1)), root);
    std::vector<double> records = root == world_.rank() ? trace_ : std::vector<double>();
    records.resize(static_cast<std::size_t>(n));
    world_.broadcast(std::as_writable_bytes(std::span<double>(records)), root);
    if (world_.rank() != 0) continue;
    const MeshCoords c = mesh_->shape().coords_of(root);
    events.push_back(
        {{"name", "process_name"},
         {"ph", "M"},
         {"pid", root},
         {"args",
          {{"name", fmt::format("rank {} (pp {}, dp {}, tp {}; peers in actions are pp ranks)",
                                root, c.pp, c.dp, c.tp)}}}});
    for (std::size_t i = 0; i + kFields <= records.size(); i += kFields) {
      const pp::Action action{.kind = static_cast<pp::ActionKind>(records[i + 1]),
                              .microbatch = static_cast<int>(records[i + 2]),
                              .chunk = static_cast<int>(records[i + 3]),
                              .peer = static_cast<int>(records[i + 4])};
      events.push_back({{"name", pp::to_string(action)},
                        {"cat", fmt::format("step {}", static_cast<int>(records[i]) + 1)},
                        {"ph", "X"},
                        {"pid", root},
                        {"tid", 0},
                        {"ts", records[i + 5] * 1e6},
                        {"dur", (records[i + 6] - records[i + 5]) * 1e6}});
    }
  }
  if (world_.rank() != 0) return;
  const nlohmann::json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  const std::string text = trace.dump();
  StagedFile(options_.trace_path, std::as_bytes(std::span<const char>(text))).commit();
  if (options_.log) fmt::print("wrote pipeline trace to {}\n", options_.trace_path);
}

void Trainer::log_step(const StepMetrics& m) {
  if (mesh_->rank() != 0) return;
  const TrainingConfig& t = config_.training;
  if (options_.log && (m.step % t.log_interval == 0 || m.step == 1 || m.val_loss)) {
    fmt::print(
        "step {:>5}/{} | loss {:.4f} | lr {:.3e} | grad_norm {:.4f} | {:7.1f} ms | "
        "{:>8.0f} tokens/s | MFU {:5.1f}% | peak {}{}{}{}\n",
        m.step, t.max_steps, m.loss, m.lr, m.grad_norm, m.step_time_s * 1e3, m.tokens_per_s,
        m.mfu * 100.0, mib(m.peak_bytes),
        scaler_ ? fmt::format(" | scale {:g}{}", m.loss_scale, m.skipped ? " (skipped)" : "") : "",
        config_.parallel.pp > 1 ? fmt::format(" | bubble {:.1f}% (schedule {:.1f}%)",
                                              m.bubble * 100.0, predicted_bubble_ * 100.0)
                                : "",
        m.val_loss ? fmt::format(" | val_loss {:.4f}", *m.val_loss) : "");
    std::fflush(stdout);
  }
  if (options_.log && m.straggler_report) {
    std::string names;
    for (const Straggler& s : m.stragglers) {
      const MeshCoords c = mesh_->shape().coords_of(s.rank);
      names += fmt::format("{}rank {} (pp {} dp {} tp {}) {} {:.1f} ms/step vs median {:.1f}",
                           names.empty() ? "" : "; ", s.rank, c.pp, c.dp, c.tp, to_string(s.phase),
                           s.seconds * 1e3, s.median * 1e3);
    }
    fmt::print("straggler report, steps {}–{}: {}\n",
               m.step - config_.training.straggler_interval + 1, m.step,
               names.empty() ? "none" : names);
  }
  if (metrics_.is_open()) {
    nlohmann::json line = {{"step", m.step},
                           {"loss", m.loss},
                           {"lr", m.lr},
                           {"grad_norm", m.grad_norm},
                           {"step_time_s", m.step_time_s},
                           {"tokens_per_s", m.tokens_per_s},
                           {"mfu", m.mfu},
                           {"peak_bytes", m.peak_bytes},
                           {"tp_comm_bytes", m.tp_comm_bytes},
                           {"dp_comm_bytes", m.dp_comm_bytes},
                           {"tp_comm_s", m.tp_comm_s},
                           {"dp_comm_s", m.dp_comm_s},
                           {"cp_comm_bytes", m.cp_comm_bytes},
                           {"cp_comm_s", m.cp_comm_s},
                           {"attention_s", m.attention_s},
                           {"bubble", m.bubble},
                           {"predicted_bubble", predicted_bubble_},
                           {"loss_scale", m.loss_scale},
                           {"skipped", m.skipped},
                           {"checkpoint_s", m.checkpoint_s}};
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      const auto category = static_cast<MemCategory>(c);
      line[fmt::format("peak_bytes_{}", to_string(category))] =
          TrackedAllocator::instance().stats(category).peak_bytes;
    }
    if (m.val_loss) line["val_loss"] = *m.val_loss;
    if (m.straggler_report) {
      nlohmann::json list = nlohmann::json::array();
      for (const Straggler& s : m.stragglers) {
        list.push_back({{"rank", s.rank},
                        {"phase", to_string(s.phase)},
                        {"s_per_step", s.seconds},
                        {"median_s_per_step", s.median}});
      }
      line["stragglers"] = list;
    }
    metrics_ << line.dump() << '\n';
    metrics_.flush();
  }
}

}  // namespace meshtrain
