#include "meshtrain/plan/formulas.h"

#include <algorithm>
#include <stdexcept>

namespace meshtrain::plan {
namespace {

double ring_fraction(std::int64_t n) { return static_cast<double>(n - 1) / static_cast<double>(n); }

}  // namespace

double all_reduce_s(double bytes, std::int64_t n, double bandwidth, double latency) {
  if (n <= 1) return 0.0;
  return 2.0 * ring_fraction(n) * bytes / bandwidth + 2.0 * static_cast<double>(n - 1) * latency;
}

double reduce_scatter_s(double bytes, std::int64_t n, double bandwidth, double latency) {
  if (n <= 1) return 0.0;
  return ring_fraction(n) * bytes / bandwidth + static_cast<double>(n - 1) * latency;
}

double all_gather_s(double bytes, std::int64_t n, double bandwidth, double latency) {
  // The mirror image of reduce-scatter: the same n − 1 steps of D/n (Thakur et al. 2005, §4).
  return reduce_scatter_s(bytes, n, bandwidth, latency);
}

double all_to_all_s(double bytes, std::int64_t n, double bandwidth, double latency) {
  // Pairwise exchange: each rank sends (n − 1) blocks of D/n, one peer per step.
  return reduce_scatter_s(bytes, n, bandwidth, latency);
}

double p2p_s(double bytes, double bandwidth, double latency) { return bytes / bandwidth + latency; }

double all_reduce_wire_bytes(double bytes, std::int64_t n) {
  return n <= 1 ? 0.0 : 2.0 * ring_fraction(n) * bytes;
}

double bubble_fraction(PipelineSchedule schedule, std::int64_t p, std::int64_t m, std::int64_t v) {
  const double pm1 = static_cast<double>(p - 1), md = static_cast<double>(m);
  switch (schedule) {
    case PipelineSchedule::interleaved_1f1b:
      return pm1 / (static_cast<double>(v) * md + pm1);
    case PipelineSchedule::zb_h1:
      return pm1 / (3.0 * md + pm1);
    case PipelineSchedule::gpipe:
    case PipelineSchedule::one_f_one_b:
      break;
  }
  return pm1 / (md + pm1);
}

std::string bubble_formula(PipelineSchedule schedule) {
  if (schedule == PipelineSchedule::interleaved_1f1b) return "(p−1)/(v·m+p−1)";
  if (schedule == PipelineSchedule::zb_h1) return "(p−1)/(3m+p−1)";
  return "(p−1)/(m+p−1)";
}

double in_flight_micro_batches(PipelineSchedule schedule, std::int64_t p, std::int64_t stage,
                               std::int64_t m, std::int64_t v) {
  if (p <= 1) return 1.0;
  switch (schedule) {
    case PipelineSchedule::gpipe:
      return static_cast<double>(m);
    case PipelineSchedule::zb_h1:
      return static_cast<double>(std::min(p, m));
    case PipelineSchedule::interleaved_1f1b: {
      const std::int64_t chunks = std::min(2 * (p - stage - 1) + (v - 1) * p + 1, v * m);
      return static_cast<double>(chunks) / static_cast<double>(v);
    }
    case PipelineSchedule::one_f_one_b:
      break;
  }
  return static_cast<double>(std::min(p - stage, m));  // 1f1b
}

double model_flops_per_token(double matmul_params, std::int64_t layers, std::int64_t hidden,
                             std::int64_t seq) {
  return 6.0 * matmul_params + 12.0 * static_cast<double>(layers) * static_cast<double>(hidden) *
                                   static_cast<double>(seq);
}

double hardware_flops_per_token(double matmul_params, double block_matmul_params,
                                std::int64_t layers, std::int64_t hidden, std::int64_t seq,
                                RecomputeMode recompute) {
  const double attention_forward =
      4.0 * static_cast<double>(layers) * static_cast<double>(hidden) * static_cast<double>(seq);
  double extra = 0.0;
  if (recompute == RecomputeMode::full) extra = 2.0 * block_matmul_params + attention_forward;
  if (recompute == RecomputeMode::selective) extra = attention_forward;
  return model_flops_per_token(matmul_params, layers, hidden, seq) + extra;
}

double attention_score_s(double bytes_per_element, std::int64_t layers, double heads_per_rank,
                         std::int64_t micro_batch, std::int64_t seq, std::int64_t micro_batches,
                         double memory_bandwidth) {
  if (bytes_per_element <= 0.0 || memory_bandwidth <= 0.0) return 0.0;
  const double s = static_cast<double>(seq);
  const double elements = static_cast<double>(layers) * heads_per_rank *
                          static_cast<double>(micro_batch) * s * s *
                          static_cast<double>(micro_batches);
  return bytes_per_element * elements / memory_bandwidth;
}

}  // namespace meshtrain::plan
