#include "meshtrain/plan/published_runs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "meshtrain/plan/formulas.h"
#include "meshtrain/plan/presets.h"

namespace meshtrain::plan {
namespace {

double f(std::int64_t v) { return static_cast<double>(v); }

}  // namespace

const std::vector<PublishedRun>& narayanan2021_table1() {
  // Narayanan et al. 2021, Table 1 ("Weak-scaling throughput for GPT models ranging from 1
  // billion to 1 trillion parameters"), every column as published: parameters (billion),
  // attention heads, hidden size, layers, tensor-parallel size, pipeline-parallel size, GPUs,
  // batch size, achieved teraFLOP/s per GPU, percentage of theoretical peak, achieved aggregate
  // petaFLOP/s. §5.1: all models use vocabulary 51,200 and sequence length 2048; the FLOP/s
  // are computed with Eq. 3 (which counts the recomputed forward) over the end-to-end iteration
  // time. §5: Selene, DGX A100 80GB nodes, A100 16-bit peak 312 teraFLOP/s. Abstract: the 1T run
  // is 502 petaFLOP/s on 3072 GPUs, 52 % of peak.
  static const std::vector<PublishedRun> rows = {
      {"1.7B", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4},
      {"3.6B", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8},
      {"7.5B", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2},
      {"18.4B", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6},
      {"39.1B", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8},
      {"76.1B", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8},
      {"145.6B", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1},
      {"310.1B", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4},
      {"529.6B", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2},
      {"1T", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0},
  };
  return rows;
}

TimeSettings megatron_2021_time() {
  TimeSettings t;
  t.activation_wire_bytes = 2.0;
  t.gradient_wire_bytes = 2.0;
  t.pp_scatter_gather = true;
  t.dp_bucket_bytes = std::numeric_limits<double>::infinity();
  t.dp_overlap = 0.0;
  // The attention core of Megatron-LM 2021 materialises the fp16 scores (§4.2: fused
  // scale-mask-softmax; attention dropout 0.1). Bytes per score element, counted pass by pass:
  // forward 13 = QKᵀ writes 2, softmax reads 2 and writes 2, dropout reads 2, writes 2 and a
  // 1-byte mask, the product with V reads 2; backward 19 = the dV product reads the dropped
  // probabilities 2, the dP product writes 2, dropout backward reads 2 + 1 and writes 2, softmax
  // backward reads the probabilities 2 and the gradient 2 and writes 2, the dQ and dK products
  // read it 2 + 2. Counted, not fitted.
  t.attention_score_bytes_forward = 13.0;
  t.attention_score_bytes_backward = 19.0;
  return t;
}

ModelConfig published_model(const PublishedRun& run, const PublishedAssumptions& a) {
  ModelConfig m;
  m.family = ModelFamily::gpt2;
  m.n_layer = run.layers;
  m.n_head = run.heads;
  m.n_embd = run.hidden;
  m.block_size = a.seq;
  m.vocab_size = a.vocab;
  m.bias = true;
  return m;
}

Layout published_layout(const PublishedRun& run, const PublishedAssumptions& a) {
  Layout l;
  l.tp = run.tp;
  l.pp = run.pp;
  l.dp = run.gpus / (run.tp * run.pp);
  l.micro_batch = a.micro_batch;
  l.accumulation = run.global_batch / (l.dp * a.micro_batch);
  l.recompute = a.recompute;
  l.schedule = run.pp > 1 ? a.schedule : PipelineSchedule::one_f_one_b;
  l.v = l.schedule == PipelineSchedule::interleaved_1f1b ? a.v : 1;
  return l;
}

TrainingSettings published_settings(const PublishedRun& run, const PublishedAssumptions& a) {
  return {.seq = a.seq, .global_batch = run.global_batch, .precision = a.precision};
}

ClusterSpec published_cluster(const PublishedRun& run) {
  ClusterSpec c = cluster_from("8xA100-80GB");
  c.nodes = run.gpus / c.devices_per_node;
  return c;
}

double narayanan_flops_per_iteration(std::int64_t batch, std::int64_t seq, std::int64_t layers,
                                     std::int64_t hidden, std::int64_t vocab) {
  const double B = f(batch), s = f(seq), l = f(layers), h = f(hidden), V = f(vocab);
  return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
}

PublishedCheck check_published_run(const PublishedRun& run, const TimeSettings& time,
                                   const PublishedAssumptions& a) {
  PublishedCheck c;
  c.run = run;
  c.plan = account(published_model(run, a), published_layout(run, a), published_settings(run, a),
                   published_cluster(run), time);
  c.flops_per_iteration =
      narayanan_flops_per_iteration(run.global_batch, a.seq, run.layers, run.hidden, a.vocab);
  const double n = f(run.gpus);
  c.published_step_s = c.flops_per_iteration / (n * run.tflops_per_gpu * 1e12);
  c.predicted_tflops = c.flops_per_iteration / (n * c.plan.step_s) / 1e12;
  c.error = c.predicted_tflops / run.tflops_per_gpu - 1.0;
  return c;
}

double calibrate_efficiency(const PublishedRun& run, TimeSettings time,
                            const PublishedAssumptions& a) {
  auto predicted = [&](double efficiency) {
    time.efficiency = efficiency;
    return check_published_run(run, time, a).predicted_tflops;
  };
  if (predicted(1.0) < run.tflops_per_gpu) {
    throw std::runtime_error(fmt::format(
        "{}: even at efficiency 1 the plan is slower than the published {} TFLOP/s per GPU",
        run.name, run.tflops_per_gpu));
  }
  double lo = 1e-3, hi = 1.0;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (predicted(mid) < run.tflops_per_gpu ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::vector<PublishedCheck> check_published_runs(TimeSettings time, const PublishedAssumptions& a) {
  for (const PublishedRun& run : narayanan2021_table1()) {
    if (std::string(run.name) == kCalibrationRun)
      time.efficiency = calibrate_efficiency(run, time, a);
  }
  std::vector<PublishedCheck> out;
  for (const PublishedRun& run : narayanan2021_table1()) {
    out.push_back(check_published_run(run, time, a));
  }
  return out;
}

const std::vector<SeedLayoutRow>& seed000_table() {
  // Seed 000, §6.2 "真实生产环境配置表" (模型规模 | 硬件配置 | TP | PP | DP | CP | EP | 关键参数 |
  // 吞吐 samples/sec), and the note under it: "70B的182 samples/sec是在global_batch=1024 ...".
  using enum PipelineSchedule;
  static const std::vector<SeedLayoutRow> rows = {
      {"Llama-3-8B", "llama3-8b", 4, 2, 1, 2, 1, 1, 2048, true, 16, 8, one_f_one_b, 0.0, 328.0},
      {"Llama-3-70B", "llama3-70b", 32, 4, 4, 2, 1, 1, 2048, false, 1024, 4, interleaved_1f1b,
       0.0, 182.0},
      {"Mixtral-8x7B", "mixtral-8x7b", 64, 4, 2, 4, 1, 8, 2048, false, 1024, 1, one_f_one_b, 1.8,
       145.0},
      {"LongChat-32B", "llama-33b", 16, 2, 2, 4, 4, 1, 32768, true, 16, 1, one_f_one_b, 0.0,
       89.0},
  };
  return rows;
}

const SeedLayoutRow& seed000_row(const std::string& name) {
  for (const SeedLayoutRow& row : seed000_table()) {
    if (name == row.name) return row;
  }
  throw std::invalid_argument("seed 000 has no row " + name);
}

const SeedLayoutRow& seed000_longchat() { return seed000_row("LongChat-32B"); }

Layout seed_layout(const SeedLayoutRow& row) {
  Layout l;
  l.tp = row.tp;
  l.pp = row.pp;
  l.dp = row.dp;
  l.cp = row.cp;
  l.ep = row.ep;
  l.cp_comm = CpCommMode::p2p;
  l.micro_batch = row.micro_batch;
  l.accumulation = std::max<std::int64_t>(1, row.global_batch / (row.dp * row.micro_batch));
  l.recompute = row.seq >= 16384 ? RecomputeMode::full : RecomputeMode::selective;
  l.schedule = row.schedule;
  l.v = row.schedule == PipelineSchedule::interleaved_1f1b ? 2 : 1;
  return l;
}

TrainingSettings seed_settings(const SeedLayoutRow& row) {
  return {.seq = row.seq, .global_batch = row.global_batch, .precision = Precision::bf16};
}

ClusterSpec seed_cluster(const SeedLayoutRow& row) {
  ClusterSpec c = cluster_from("8xA100-80GB");
  c.nodes = std::max<std::int64_t>(1, row.gpus / c.devices_per_node);
  if (row.gpus < c.devices_per_node) c.devices_per_node = row.gpus;  // 4 GPUs of one node
  return c;
}

ModelConfig seed_model(const SeedLayoutRow& row) {
  ModelConfig m = model_from(row.model_preset).model;
  if (m.moe_experts > 0) m.moe_capacity_factor = row.capacity_factor;
  return m;
}

std::string format_published_table(const std::vector<PublishedCheck>& checks) {
  std::string out =
      "| model | t | p | d | v | B | m | published TFLOP/s (% peak) | predicted TFLOP/s (% peak) "
      "| error | bubble | exposed comm / step |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const PublishedCheck& c : checks) {
    const Layout& l = c.plan.layout;
    out += fmt::format(
        "| {} | {} | {} | {} | {} | {} | {} | {:.0f} ({:.0f} %) | {:.1f} ({:.1f} %) | {:+.1f} % "
        "| {:.1f} % | {:.1f} % |\n",
        c.run.name, l.tp, l.pp, l.dp, l.v, c.run.global_batch, l.accumulation, c.run.tflops_per_gpu,
        c.run.percent_of_peak, c.predicted_tflops, 100.0 * c.predicted_tflops / 312.0,
        100.0 * c.error, 100.0 * c.plan.bubble, 100.0 * c.plan.exposed_comm_s / c.plan.step_s);
  }
  return out;
}

}  // namespace meshtrain::plan
