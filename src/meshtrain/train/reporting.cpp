#include "meshtrain/train/reporting.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/system.h"

namespace meshtrain {
namespace {

// Every world rank's host name, from one all-gather of a fixed 64-byte field per rank (the
// bytes travel as 16 floats: all_gather copies them bit for bit). Longer names are cut to 63
// bytes; they only label the straggler report.
std::vector<std::string> gather_host_names(ProcessGroup& world) {
  constexpr std::size_t kBytes = 64;
  std::array<char, kBytes> mine{};
  const std::string name = host_name();
  std::copy_n(name.begin(), std::min(name.size(), kBytes - 1), mine.begin());
  std::vector<float> in(kBytes / sizeof(float));
  std::memcpy(in.data(), mine.data(), kBytes);
  std::vector<float> all(in.size() * static_cast<std::size_t>(world.size()));
  world.all_gather(in, all);
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data()) + static_cast<std::size_t>(r) * kBytes;
    hosts.emplace_back(p, strnlen(p, kBytes - 1));
  }
  return hosts;
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

std::string moe_summary(const StepMetrics& m) {
  if (m.moe.empty()) return "";
  // The worst layer's imbalance, the dropped fraction and the aux loss over all MoE layers.
  double imbalance = 0.0, dropped = 0.0, aux = 0.0;
  for (const MoeLayerMetrics& l : m.moe) {
    imbalance = std::max(imbalance, l.imbalance);
    dropped += l.dropped_fraction / static_cast<double>(m.moe.size());
    aux += l.aux_loss;
  }
  return fmt::format(" | moe imbalance {:.2f} dropped {:.1f}% aux {:.4f}", imbalance,
                     dropped * 100.0, aux);
}

// The TensorBoard tag of a top-level metrics key: grouped so that TensorBoard's sections
// (the part before '/') gather related curves.
std::string tensorboard_tag(const std::string& key) {
  if (key == "val_loss") return "val/loss";
  if (key.starts_with("peak_bytes") || key == "allocator_misses" || key == "minor_faults") {
    return "memory/" + key;
  }
  if (key.find("_comm_") != std::string::npos || key == "attention_s") return "comm/" + key;
  if (key == "elapsed_s" || key == "eta_s") return "progress/" + key;
  for (const char* perf :
       {"step_time_s", "tokens_per_s", "mfu", "bubble", "predicted_bubble", "checkpoint_s"}) {
    if (key == perf) return "perf/" + key;
  }
  return "train/" + key;  // loss, lr, grad_norm, loss_scale, skipped
}

}  // namespace

CommSnapshot comm_snapshot(const DeviceMesh& mesh, double attention_s) {
  CommCounter dp = comm_total(mesh.group(Axis::dp));
  if (&mesh.dp_cp_group() != &mesh.group(Axis::dp)) {  // cp > 1: the gradient reduction
    const CommCounter dp_cp = comm_total(mesh.dp_cp_group());
    dp.calls += dp_cp.calls;
    dp.bytes += dp_cp.bytes;
    dp.seconds += dp_cp.seconds;
  }
  return {.tp = comm_total(mesh.group(Axis::tp)),
          .dp = dp,
          .cp = comm_total(mesh.group(Axis::cp)),
          .ep = comm_total(mesh.group(Axis::ep)),
          .attention_s = attention_s};
}

void set_comm_metrics(const CommSnapshot& before, const CommSnapshot& after, StepMetrics& m) {
  m.tp_comm_bytes = after.tp.bytes - before.tp.bytes;
  m.dp_comm_bytes = after.dp.bytes - before.dp.bytes;
  m.tp_comm_s = after.tp.seconds - before.tp.seconds;
  m.dp_comm_s = after.dp.seconds - before.dp.seconds;
  m.cp_comm_bytes = after.cp.bytes - before.cp.bytes;
  m.cp_comm_s = after.cp.seconds - before.cp.seconds;
  m.attention_s = after.attention_s - before.attention_s;
  m.ep_comm_bytes = after.ep.bytes - before.ep.bytes;
  m.ep_comm_s = after.ep.seconds - before.ep.seconds;
}

std::vector<TensorBoardScalar> tensorboard_scalars(const nlohmann::json& line) {
  std::vector<TensorBoardScalar> out;
  for (const auto& [key, value] : line.items()) {
    if (key == "step") continue;
    if (key == "moe") {
      for (const nlohmann::json& layer : value) {
        const std::string prefix = fmt::format("moe/layer_{}/", layer.at("layer").get<int>());
        for (const auto& [field, v] : layer.items()) {
          if (field == "layer") continue;
          if (!v.is_array()) {
            out.push_back({prefix + field, v.get<double>()});
            continue;
          }
          for (std::size_t e = 0; e < v.size(); ++e) {
            out.push_back({fmt::format("{}{}/{}", prefix, field, e), v[e].get<double>()});
          }
        }
      }
    } else if (key == "stragglers") {
      out.push_back({"stragglers/count", static_cast<double>(value.size())});
    } else if (value.is_number() || value.is_boolean()) {
      out.push_back({tensorboard_tag(key),
                     value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>()});
    }
  }
  return out;
}

Reporting::Reporting(const Config& config, const TrainerOptions& options, ProcessGroup& world,
                     const DeviceMesh& mesh, const ProcessGroup* tied_group,
                     double predicted_bubble)
    : config_(config),
      options_(options),
      world_(world),
      mesh_(mesh),
      tied_group_(tied_group),
      predicted_bubble_(predicted_bubble),
      clock_([this] { return comm_seconds(); }),
      eta_(config.training.max_steps, config.training.eval_interval) {
  if (config.training.straggler_interval > 0) hosts_ = gather_host_names(world);
  // Rank 0 checked before anything was allocated that the files can be written (Trainer).
  if (world.rank() != 0) return;
  if (!options.metrics_path.empty()) {
    metrics_.open(options.metrics_path,
                  config.checkpoint.resume.empty() ? std::ios::trunc : std::ios::app);
  }
  if (!options.tensorboard_dir.empty()) {
    tensorboard_write([&] {
      tensorboard_ = std::make_unique<TensorBoardWriter>(options.tensorboard_dir);
      tensorboard_->add_text("config", 0, to_toml(config));
      tensorboard_->flush();
    });
  }
}

void Reporting::start_clock() {
  world_.barrier();  // a common time origin (one clock per machine)
  t0_ = std::chrono::steady_clock::now();
}

double Reporting::seconds_since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

double Reporting::comm_seconds() const {
  double s = 0.0;
  for (const Axis axis : {Axis::tp, Axis::dp, Axis::pp, Axis::cp})
    s += comm_total(mesh_.group(axis)).seconds;
  if (&mesh_.dp_cp_group() != &mesh_.group(Axis::dp)) s += comm_total(mesh_.dp_cp_group()).seconds;
  if (tied_group_ != nullptr) s += comm_total(*tied_group_).seconds;
  return s;
}

void Reporting::end_step(double comm_start) {
  window_[Phase::comm_wait] += comm_seconds() - comm_start;
  ++window_steps_;
}

std::vector<Straggler> Reporting::straggler_report(PhaseSeconds& runner_phases) {
  PhaseSeconds mine = window_;
  for (const Phase p : {Phase::data, Phase::forward, Phase::backward}) mine[p] = runner_phases[p];
  const std::int64_t steps = window_steps_;
  std::vector<float> in(kNumPhases);
  for (std::size_t i = 0; i < kNumPhases; ++i) in[i] = static_cast<float>(mine.s[i]);
  std::vector<float> all(kNumPhases * static_cast<std::size_t>(world_.size()));
  world_.all_gather(in, all);
  std::vector<PhaseSeconds> per_rank(static_cast<std::size_t>(world_.size()));
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    for (std::size_t i = 0; i < kNumPhases; ++i) per_rank[r].s[i] = all[r * kNumPhases + i];
  }
  window_ = {};
  runner_phases = {};
  window_steps_ = 0;
  return find_stragglers(per_rank, steps, config_.training.straggler_threshold);
}

void Reporting::report_peak_memory() {
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
    if (row[kNumMemCategories] > summary_.peak_bytes) {
      summary_.peak_bytes = row[kNumMemCategories];
      summary_.peak_rank = root;
    }
    const MeshCoords c = mesh_.shape().coords_of(root);
    table += fmt::format("  {:>4}  {:>2} {:>2} {:>2} {:>2}", root, c.pp, c.dp, c.cp, c.tp);
    for (std::int64_t bytes : row)
      table += fmt::format(" {:>11.2f}", static_cast<double>(bytes) / 1048576.0);
    table += "\n";
  }
  if (world_.rank() != 0 || !options_.log) return;
  std::string header = "  rank  pp dp cp tp";
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    header += fmt::format(" {:>11}", to_string(static_cast<MemCategory>(c)));
  }
  fmt::print("peak memory per rank (MiB, tracked allocator):\n{} {:>11}\n{}", header, "total",
             table);
}

void Reporting::log_step(const StepMetrics& m) {
  if (mesh_.rank() != 0) return;
  const TrainingConfig& t = config_.training;
  // The step's wall time runs from the previous step's log to this one: training, evaluation,
  // checkpoint and logging (the ETA's w_i, train/progress.h).
  const double elapsed_s = seconds_since_start();
  eta_.add(m, elapsed_s - last_step_end_s_);
  last_step_end_s_ = elapsed_s;
  summary_.add(m, global_batch_of(config_) * config_.model.block_size, elapsed_s);
  const double eta_s = eta_.eta_s();
  if (options_.log && (m.step % t.log_interval == 0 || m.step == 1 || m.val_loss)) {
    fmt::print(
        "step {:>5}/{} | loss {:.4f} | lr {:.3e} | grad_norm {:.4f} | {:7.1f} ms | "
        "{:>8.0f} tokens/s | MFU {:5.1f}% | peak {} | elapsed {} | ETA {}{}{}{}{}\n",
        m.step, t.max_steps, m.loss, m.lr, m.grad_norm, m.step_time_s * 1e3, m.tokens_per_s,
        m.mfu * 100.0, mib(m.peak_bytes), format_duration(elapsed_s), format_duration(eta_s),
        config_.training.precision == Precision::fp16
            ? fmt::format(" | scale {:g}{}", m.loss_scale, m.skipped ? " (skipped)" : "")
            : "",
        config_.parallel.pp > 1 ? fmt::format(" | bubble {:.1f}% (schedule {:.1f}%)",
                                              m.bubble * 100.0, predicted_bubble_ * 100.0)
                                : "",
        m.val_loss ? fmt::format(" | val_loss {:.4f}", *m.val_loss) : "", moe_summary(m));
    std::fflush(stdout);
  }
  if (options_.log && m.straggler_report) print_stragglers(m);
  if (!metrics_.is_open() && !tensorboard_) return;
  const nlohmann::json line = metrics_line(m, elapsed_s, eta_s);
  if (metrics_.is_open()) {
    metrics_ << line.dump() << '\n';
    metrics_.flush();
  }
  if (tensorboard_) {
    tensorboard_write([&] {
      tensorboard_->add_scalars(m.step, tensorboard_scalars(line));
      tensorboard_->flush();  // a run killed later keeps this step
    });
  }
}

void Reporting::tensorboard_write(const std::function<void()>& write) {
  // Only rank 0 writes: an exception here would stop it alone and leave the other ranks
  // waiting in the next collective. A full disk costs the TensorBoard file, not the run.
  try {
    write();
  } catch (const DataError& e) {
    fmt::print(stderr, "meshtrain: warning: {}; no more TensorBoard events are written\n",
               e.what());
    tensorboard_.reset();
  }
}

void Reporting::finish_run() {
  if (world_.rank() != 0) return;
  if (options_.log && summary_.steps > 0) {
    fmt::print("{}\n", summary_.format());
    std::fflush(stdout);
  }
  if (tensorboard_) {
    tensorboard_write([&] { tensorboard_->close(); });
    if (tensorboard_ && options_.log) {
      fmt::print("wrote TensorBoard events to {}\n", tensorboard_->path().string());
    }
  }
}

std::string Reporting::host_of(int world_rank) const {
  return static_cast<std::size_t>(world_rank) < hosts_.size()
             ? hosts_[static_cast<std::size_t>(world_rank)]
             : std::string("?");
}

void Reporting::print_stragglers(const StepMetrics& m) const {
  std::string names;
  for (const Straggler& s : m.stragglers) {
    const MeshCoords c = mesh_.shape().coords_of(s.rank);
    names += fmt::format(
        "{}rank {} on {} (pp {} dp {} cp {} tp {}) {} {:.1f} ms/step vs median {:.1f}",
        names.empty() ? "" : "; ", s.rank, host_of(s.rank), c.pp, c.dp, c.cp, c.tp,
        to_string(s.phase), s.seconds * 1e3, s.median * 1e3);
  }
  fmt::print("straggler report, steps {}–{}: {}\n",
             m.step - config_.training.straggler_interval + 1, m.step,
             names.empty() ? "none" : names);
}

nlohmann::json Reporting::metrics_line(const StepMetrics& m, double elapsed_s, double eta_s) const {
  nlohmann::json line = {{"step", m.step},
                         {"epoch", m.epoch},
                         {"loss", m.loss},
                         {"lr", m.lr},
                         {"grad_norm", m.grad_norm},
                         {"step_time_s", m.step_time_s},
                         {"tokens_per_s", m.tokens_per_s},
                         {"mfu", m.mfu},
                         {"peak_bytes", m.peak_bytes},
                         {"allocator_misses", m.allocator_misses},
                         {"minor_faults", m.minor_faults},
                         {"tp_comm_bytes", m.tp_comm_bytes},
                         {"dp_comm_bytes", m.dp_comm_bytes},
                         {"tp_comm_s", m.tp_comm_s},
                         {"dp_comm_s", m.dp_comm_s},
                         {"dp_comm_exposed_s", m.dp_comm_exposed_s},
                         {"cp_comm_bytes", m.cp_comm_bytes},
                         {"cp_comm_s", m.cp_comm_s},
                         {"attention_s", m.attention_s},
                         {"ep_comm_bytes", m.ep_comm_bytes},
                         {"ep_comm_s", m.ep_comm_s},
                         {"bubble", m.bubble},
                         {"predicted_bubble", predicted_bubble_},
                         {"loss_scale", m.loss_scale},
                         {"skipped", m.skipped},
                         {"checkpoint_s", m.checkpoint_s},
                         {"elapsed_s", elapsed_s},
                         {"eta_s", eta_s}};
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    const auto category = static_cast<MemCategory>(c);
    line[fmt::format("peak_bytes_{}", to_string(category))] =
        TrackedAllocator::instance().stats(category).peak_bytes;
  }
  if (m.val_loss) line["val_loss"] = *m.val_loss;
  if (!m.moe.empty()) {
    nlohmann::json layers = nlohmann::json::array();
    for (const MoeLayerMetrics& l : m.moe) {
      layers.push_back({{"layer", l.layer},
                        {"tokens_per_expert", l.tokens_per_expert},
                        {"routed_per_expert", l.routed_per_expert},
                        {"dropped_fraction", l.dropped_fraction},
                        {"imbalance", l.imbalance},
                        {"aux_loss", l.aux_loss},
                        {"z_loss", l.z_loss}});
    }
    line["moe"] = layers;
  }
  if (m.straggler_report) {
    nlohmann::json list = nlohmann::json::array();
    for (const Straggler& s : m.stragglers) {
      list.push_back({{"rank", s.rank},
                      {"host", host_of(s.rank)},
                      {"phase", to_string(s.phase)},
                      {"s_per_step", s.seconds},
                      {"median_s_per_step", s.median}});
    }
    line["stragglers"] = list;
  }
  return line;
}

}  // namespace meshtrain
