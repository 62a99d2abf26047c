#include "meshtrain/train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "meshtrain/checkpoint/model_checkpoint.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/system.h"
#include "meshtrain/kernels/kernels.h"
#include "meshtrain/parallel/tp/gather.h"

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
  fs::create_directories(dir, ec);
  const fs::path probe = dir / ".meshtrain_write_probe";
  std::ofstream out(probe);
  if (ec || !out) {
    throw ConfigError(source,
                      {{"checkpoint.dir", dir.string(),
                        fmt::format("must be a directory meshtrain can create and write ({})",
                                    ec ? ec.message() : std::string("cannot create a file in it")),
                        "choose another checkpoint.dir, or checkpoint.save_final = false"}});
  }
  out.close();
  fs::remove(probe, ec);
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

Trainer::Trainer(Config config, const ProcessGroup& world, TrainerOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  validate_or_throw(config_, world.size());
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
  if (config_.checkpoint.save_final) check_writable_dir(config_.checkpoint.dir, config_.source);
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
  threads_ = threads_per_rank(config_, options_.local_ranks);
  kernels::set_num_threads(threads_);

  ProcessGroup& tp = mesh_->group(Axis::tp);
  model_ = std::make_unique<CausalLm>(config_.model, seed,
                                      TensorParallel{tp, config_.parallel.sequence_parallel});
  replicated_grads_ = std::make_unique<ReplicatedGradSum>(model_->parameters(), tp,
                                                          config_.parallel.sequence_parallel);
  buckets_ =
      std::make_unique<GradBuckets>(model_->parameters(), dp, config_.parallel.bucket_mib << 20);
  optimizer_ = std::make_unique<AdamW>(model_->parameters(),
                                       AdamWConfig{.beta1 = config_.training.beta1,
                                                   .beta2 = config_.training.beta2,
                                                   .eps = config_.training.eps,
                                                   .weight_decay = config_.training.weight_decay});
  const std::size_t micro_tokens =
      static_cast<std::size_t>(config_.training.micro_batch * config_.model.block_size);
  inputs_.resize(micro_tokens);
  targets_.resize(micro_tokens);
  if (mesh_->rank() == 0 && !options_.metrics_path.empty()) {
    metrics_.open(options_.metrics_path, std::ios::trunc);
    if (!metrics_)
      throw DataError(fmt::format("cannot write metrics to {}", options_.metrics_path));
  }
}

Trainer::Gradients Trainer::compute_gradients(std::int64_t step) {
  const TrainingConfig& t = config_.training;
  ProcessGroup& dp = mesh_->group(Axis::dp);
  double loss_sum = 0.0;
  for (std::int64_t a = 0; a < t.accumulation; ++a) {
    const std::int64_t first = data::first_sequence_of(a, dp.rank(), dp.size(), t.micro_batch);
    train_sampler_->fill(step, first, t.micro_batch, inputs_.data(), targets_.data());
    const float loss =
        model_->forward(inputs_.data(), targets_.data(), t.micro_batch, config_.model.block_size);
    if (!std::isfinite(loss)) {
      throw Error(fmt::format("{}: non-finite loss {} at step {}, micro-batch {}",
                              mesh_->describe(), loss, step + 1, a));
    }
    loss_sum += loss;
    // Each micro-batch's loss is a mean over its tokens; the global-batch loss is their mean.
    model_->backward(1.0f / static_cast<float>(t.accumulation));
  }
  replicated_grads_->all_reduce();  // sequence parallel: partial sums over tp, once per step
  buckets_->all_reduce_mean();      // one reduction per optimizer step
  // Every tp rank of a dp group computed the same loss; average over dp only.
  double loss = loss_sum / static_cast<double>(t.accumulation);
  dp.all_reduce_sum(std::span<double>(&loss, 1));
  loss /= dp.size();
  return {loss, global_grad_norm(model_->parameters(), mesh_->group(Axis::tp))};
}

double Trainer::apply_update(std::int64_t step, double grad_norm) {
  const TrainingConfig& t = config_.training;
  clip_grads(model_->parameters(), grad_norm, t.grad_clip);
  const std::int64_t decay_steps = t.lr_decay_steps > 0 ? t.lr_decay_steps : t.max_steps;
  const double lr = lr_at(step, scaled_peak_lr(config_), t.min_lr, t.warmup_steps, decay_steps);
  optimizer_->step(lr);
  model_->zero_grad();
  return lr;
}

double Trainer::evaluate() {
  const TrainingConfig& t = config_.training;
  ProcessGroup& dp = mesh_->group(Axis::dp);
  double sum = 0.0;
  for (std::int64_t b = 0; b < t.eval_batches; ++b) {
    for (std::int64_t a = 0; a < t.accumulation; ++a) {
      const std::int64_t first = data::first_sequence_of(a, dp.rank(), dp.size(), t.micro_batch);
      val_sampler_->fill(b, first, t.micro_batch, inputs_.data(), targets_.data());
      sum +=
          model_->forward(inputs_.data(), targets_.data(), t.micro_batch, config_.model.block_size);
    }
  }
  dp.all_reduce_sum(std::span<double>(&sum, 1));
  return sum / static_cast<double>(t.eval_batches * t.accumulation * dp.size());
}

std::vector<StepMetrics> Trainer::run() {
  const TrainingConfig& t = config_.training;
  const double tokens_per_step =
      static_cast<double>(global_batch_of(config_) * config_.model.block_size);
  const double peak_flops =
      t.peak_flops_per_core * threads_ * static_cast<double>(mesh_->shape().world_size());
  std::vector<StepMetrics> history;
  for (std::int64_t step = 0; step < t.max_steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const CommCounter tp0 = comm_total(mesh_->group(Axis::tp));
    const CommCounter dp0 = comm_total(mesh_->group(Axis::dp));
    const Gradients g = compute_gradients(step);
    StepMetrics m;
    m.step = step + 1;
    m.loss = g.loss;
    m.grad_norm = g.grad_norm;
    m.lr = apply_update(step, g.grad_norm);
    m.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    m.tokens_per_s = tokens_per_step / m.step_time_s;
    m.mfu = m.tokens_per_s * model_->flops_per_token(config_.model.block_size) / peak_flops;
    m.peak_bytes = TrackedAllocator::instance().total().peak_bytes;
    const CommCounter tp1 = comm_total(mesh_->group(Axis::tp));
    const CommCounter dp1 = comm_total(mesh_->group(Axis::dp));
    m.tp_comm_bytes = tp1.bytes - tp0.bytes;
    m.dp_comm_bytes = dp1.bytes - dp0.bytes;
    m.tp_comm_s = tp1.seconds - tp0.seconds;
    m.dp_comm_s = dp1.seconds - dp0.seconds;
    const bool last = step + 1 == t.max_steps;
    if (last || (t.eval_interval > 0 && (step + 1) % t.eval_interval == 0)) {
      m.val_loss = evaluate();
    }
    log_step(m);
    history.push_back(m);
  }
  if (config_.checkpoint.save_final) {
    // Every tp group gathers (a collective); dp replicas are identical, so rank 0 writes.
    std::vector<NamedTensor> tensors;
    for (const Parameter* p : model_->parameters()) {
      tensors.push_back({p->name, gather_logical(*p, p->value, mesh_->group(Axis::tp))});
    }
    if (mesh_->rank() == 0) {
      save_model_checkpoint(config_.checkpoint.dir, tensors, config_,
                            fs::path(config_.data.dir) / data::kMetaJsonName);
      if (options_.log) fmt::print("saved checkpoint to {}\n", config_.checkpoint.dir);
    }
  }
  return history;
}

void Trainer::log_step(const StepMetrics& m) {
  if (mesh_->rank() != 0) return;
  const TrainingConfig& t = config_.training;
  if (options_.log && (m.step % t.log_interval == 0 || m.step == 1 || m.val_loss)) {
    fmt::print(
        "step {:>5}/{} | loss {:.4f} | lr {:.3e} | grad_norm {:.4f} | {:7.1f} ms | "
        "{:>8.0f} tokens/s | MFU {:5.1f}% | peak {}{}\n",
        m.step, t.max_steps, m.loss, m.lr, m.grad_norm, m.step_time_s * 1e3, m.tokens_per_s,
        m.mfu * 100.0, mib(m.peak_bytes),
        m.val_loss ? fmt::format(" | val_loss {:.4f}", *m.val_loss) : "");
    std::fflush(stdout);
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
                           {"dp_comm_s", m.dp_comm_s}};
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      const auto category = static_cast<MemCategory>(c);
      line[fmt::format("peak_bytes_{}", to_string(category))] =
          TrackedAllocator::instance().stats(category).peak_bytes;
    }
    if (m.val_loss) line["val_loss"] = *m.val_loss;
    metrics_ << line.dump() << '\n';
    metrics_.flush();
  }
}

}  // namespace meshtrain
