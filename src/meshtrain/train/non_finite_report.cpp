#include "meshtrain/train/non_finite_report.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>

#include "meshtrain/core/half.h"
#include "meshtrain/train/collective_verdict.h"

namespace meshtrain {
namespace {

// Ranks named in one message; the rest are counted ("and N more").
constexpr int kNamedRanks = 4;

// "A; B (and 3 more ranks)".
std::string join(const HighestReports& found) {
  std::string out;
  for (const RankReport& r : found.reports) {
    if (!out.empty()) out += "; ";
    out += r.text;
  }
  const int more = found.count - static_cast<int>(found.reports.size());
  if (more > 0) out += fmt::format(" (and {} more rank{})", more, more == 1 ? "" : "s");
  return out;
}

// Where a rank put its first non-finite gradient into a reduction; 0 when it did not. An
// earlier reduction of the step ranks higher: a later one may only have passed it on.
int grad_priority(const std::optional<NonFiniteGrad>& note) {
  if (!note) return 0;
  return 3 - static_cast<int>(note->reduction);
}

std::string describe_note(const DeviceMesh& mesh, const NonFiniteGrad& note, std::int64_t step) {
  return fmt::format(
      "{}, step {}, {}, tensor {}'s gradient [element {} of this rank's shard] = {}, before {}",
      mesh.describe(), step + 1, layer_of(note.param->name), note.param->name, note.element,
      note.value, note.before);
}

// This rank's first non-finite gradient after the reductions, as "name (layer) [element i] =
// v"; "" when every one is finite.
std::string first_reduced(OptimizerState& optim) {
  for (const OptimizerShard& s : optim.shards()) {
    const auto g = s.grad.span_f32();
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (std::isfinite(g[i])) continue;
      return fmt::format("{} ({}) [element {} of its shard] = {}", s.param->name,
                         layer_of(s.param->name), s.begin + static_cast<std::int64_t>(i), g[i]);
    }
  }
  return "";
}

struct BadWeight {
  int priority = 0;  // 3: an fp32 master slice, 2: a 16-bit compute copy, 0: none
  std::string text;
};

BadWeight first_bad_master(OptimizerState& optim) {
  for (const OptimizerShard& s : optim.shards()) {
    const auto w = s.master.span_f32();
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (std::isfinite(w[i])) continue;
      return {3, fmt::format("weight {} ({}), fp32 master [element {} of this rank's shard] = {}",
                             s.param->name, layer_of(s.param->name),
                             s.begin + static_cast<std::int64_t>(i), w[i])};
    }
  }
  return {};
}

// The 16-bit copies the layers compute with (bf16/fp16 training; ZeRO-3 holds none between
// steps). An fp32 value is the master or gathered from other ranks' masters: checked there.
BadWeight first_bad_copy(const ParameterList& params) {
  for (const Parameter* p : params) {
    const Tensor& v = p->value;
    if (!v.defined() || v.dtype() == DType::f32) continue;
    const std::uint16_t* bits = v.u16();
    for (std::int64_t i = 0; i < v.numel(); ++i) {
      const float x = v.dtype() == DType::bf16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
      if (std::isfinite(x)) continue;
      return {2, fmt::format("weight {} ({}), {} compute copy [element {} of this rank's shard] = "
                             "{}",
                             p->name, layer_of(p->name), to_string(v.dtype()), i, x)};
    }
  }
  return {};
}

}  // namespace

std::string layer_of(std::string_view name) {
  for (const std::string_view blocks : {".h.", ".layers."}) {
    const std::size_t at = name.find(blocks);
    if (at == std::string_view::npos) continue;
    const std::size_t begin = at + blocks.size();
    std::size_t end = begin;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > begin) return fmt::format("layer {}", name.substr(begin, end - begin));
  }
  const std::size_t dot = name.rfind('.');
  return fmt::format("module {}", name.substr(0, dot == std::string_view::npos ? 0 : dot));
}

std::string non_finite_grad_origin(ProcessGroup& world, const DeviceMesh& mesh,
                                   OptimizerState& optim, std::int64_t step) {
  const std::optional<NonFiniteGrad>& note = optim.first_non_finite_before_reduction();
  const HighestReports found = reports_of_highest(
      world, grad_priority(note), note ? describe_note(mesh, *note, step) : "", kNamedRanks);
  if (found.count == 1) return "it first appeared on " + join(found);
  if (found.count > 1) {
    return fmt::format(
        "it first appeared on {} ranks before any reduction spread it (a value can pass "
        "between them during backward, through tp, cp or pp): {}",
        found.count, join(found));
  }
  const std::string after = first_error(world, first_reduced(optim));
  if (after.empty()) return "no rank holds a non-finite gradient: the norm itself overflowed";
  if (!optim.checks_before_reduction()) {
    return fmt::format(
        "the first non-finite gradient after the reductions (which spread it to "
        "every rank they sum over; training.check_for_nan_in_grad = true names "
        "where it first appeared) is on {}",
        after);
  }
  return fmt::format(
      "no rank put a non-finite gradient into a reduction; the first one after "
      "them is on {}",
      after);
}

std::string non_finite_loss_origin(ProcessGroup& world, const DeviceMesh& mesh,
                                   const ParameterList& params, OptimizerState& optim,
                                   double local_loss) {
  BadWeight mine = first_bad_master(optim);
  if (mine.priority == 0) mine = first_bad_copy(params);
  if (mine.priority == 0 && !std::isfinite(local_loss)) {
    mine = {1, fmt::format("local loss {}", local_loss)};
  }
  const HighestReports found =
      reports_of_highest(world, mine.priority, mesh.describe() + " " + mine.text, kNamedRanks);
  if (found.priority >= 2) {
    return "first non-finite value: " + join(found) +
           " — it was there before this step's forward (an earlier update, a corrupt checkpoint "
           "or memory): resume from an earlier checkpoint, or lower training.lr";
  }
  if (found.priority == 1) {
    return fmt::format(
        "every rank's weights are finite; the local loss was non-finite on {}: "
        "the data or an activation overflow is to blame — check the step's "
        "batch, lower training.lr, or train in bf16 rather than fp16",
        join(found));
  }
  return "every rank's weights and local losses are finite: their sum overflowed";
}

}  // namespace meshtrain
