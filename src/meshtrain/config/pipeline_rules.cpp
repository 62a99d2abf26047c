#include "meshtrain/config/pipeline_rules.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <numeric>

namespace meshtrain {
namespace {

// "3, 3,2" → {3, 3, 2}; false when an entry is not an integer.
bool parse_counts(const std::string& text, std::vector<std::int64_t>& out) {
  out.clear();
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    std::string item = text.substr(begin, end - begin);
    item.erase(std::remove(item.begin(), item.end(), ' '), item.end());
    std::int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) return false;
    out.push_back(value);
    begin = end + 1;
  }
  return true;
}

}  // namespace

std::vector<ConfigIssue> check_schedule(PipelineSchedule schedule, std::int64_t pp, std::int64_t v,
                                        std::int64_t m) {
  const struct {
    PipelineSchedule schedule;
    std::int64_t pp, v, m;
  } spec{schedule, pp, v, m};
  std::vector<ConfigIssue> issues;
  auto add = [&](std::string setting, auto value, std::string rule, std::string fix) {
    issues.push_back(
        {std::move(setting), fmt::format("{}", value), std::move(rule), std::move(fix)});
  };
  const bool interleaved = spec.schedule == PipelineSchedule::interleaved_1f1b;
  if (spec.pp < 1) {
    add("parallel.pp", spec.pp, "must be ≥ 1 (pipeline stages)",
        "use 1 for no pipeline parallelism");
  } else if (interleaved && spec.pp < 2) {
    add("parallel.pp", spec.pp,
        "interleaved_1f1b needs ≥ 2 stages: with one stage every chunk is on the same rank "
        "(each transfer would be to itself) and there is no bubble to shrink",
        "set parallel.pp ≥ 2, or parallel.pp_schedule = \"1f1b\" with "
        "parallel.virtual_stages = 1");
  }
  if (spec.v < 1) {
    add("parallel.virtual_stages", spec.v, "must be ≥ 1 (model chunks per pipeline rank)",
        interleaved ? "use 2 (or more) with interleaved_1f1b" : "use 1");
  } else if (interleaved && spec.v < 2) {
    add("parallel.virtual_stages", spec.v,
        "interleaved_1f1b needs ≥ 2 model chunks per rank (with 1 it is 1f1b)",
        "set parallel.virtual_stages = 2 (or more), or parallel.pp_schedule = \"1f1b\"");
  } else if (!interleaved && spec.v > 1) {
    add("parallel.virtual_stages", spec.v,
        fmt::format("only interleaved_1f1b runs more than one model chunk per rank; {} needs 1",
                    to_string(spec.schedule)),
        "set parallel.virtual_stages = 1, or parallel.pp_schedule = \"interleaved_1f1b\"");
  }
  if (spec.m < 1) {
    add("training.accumulation", spec.m,
        "must be ≥ 1 (the micro-batches per optimizer step, which the pipeline runs)",
        fmt::format("use at least {} (parallel.pp; more micro-batches shrink the bubble)",
                    std::max<std::int64_t>(spec.pp, 1)));
  } else if (interleaved && spec.pp >= 2 && spec.m % spec.pp != 0) {
    const std::int64_t lower = spec.m / spec.pp * spec.pp, upper = lower + spec.pp;
    add("training.accumulation", spec.m,
        fmt::format("interleaved_1f1b runs the micro-batches in groups of parallel.pp = {} "
                    "(Megatron-LM's rule): must be a multiple of {}",
                    spec.pp, spec.pp),
        lower >= spec.pp ? fmt::format("set training.accumulation to {} or {}", lower, upper)
                         : fmt::format("set training.accumulation to {} (or a multiple)", upper));
  }
  return issues;
}

std::vector<std::int64_t> layers_per_chunk(const Config& config) {
  const std::int64_t chunks = config.parallel.pp * config.parallel.virtual_stages;
  const std::int64_t layers = config.model.n_layer;
  if (chunks < 1 || layers < chunks) return {};
  std::vector<std::int64_t> out;
  if (!config.parallel.pp_layers.empty()) {
    if (!parse_counts(config.parallel.pp_layers, out)) return {};
    const bool ok = static_cast<std::int64_t>(out.size()) == chunks &&
                    std::all_of(out.begin(), out.end(), [](std::int64_t n) { return n >= 1; }) &&
                    std::accumulate(out.begin(), out.end(), std::int64_t{0}) == layers;
    return ok ? out : std::vector<std::int64_t>{};
  }
  for (std::int64_t c = 0; c < chunks; ++c) {
    out.push_back(layers / chunks + (c < layers % chunks ? 1 : 0));
  }
  return out;
}

void check_pipeline(const Config& config, std::vector<ConfigIssue>& issues) {
  const ParallelConfig& p = config.parallel;
  for (ConfigIssue& issue :
       check_schedule(p.pp_schedule, p.pp, p.virtual_stages, config.training.accumulation)) {
    // training.accumulation < 1 is reported by the batch rules already.
    if (issue.setting != "training.accumulation" || config.training.accumulation >= 1) {
      issues.push_back(std::move(issue));
    }
  }
  if (p.pp < 1 || p.virtual_stages < 1 || config.model.n_layer < 1) return;
  const std::int64_t chunks = p.pp * p.virtual_stages;
  if (!p.pp_layers.empty()) {
    std::vector<std::int64_t> counts;
    const bool parsed = parse_counts(p.pp_layers, counts);
    const std::int64_t sum = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    const bool positive =
        std::all_of(counts.begin(), counts.end(), [](std::int64_t n) { return n >= 1; });
    // Say exactly what is wrong: not integers, the count, a non-positive entry, or the sum.
    std::string problem;
    if (!parsed) {
      problem = "it is not a list of integers";
    } else if (static_cast<std::int64_t>(counts.size()) != chunks) {
      problem =
          fmt::format("it has {} {}", counts.size(), counts.size() == 1 ? "entry" : "entries");
    } else if (!positive) {
      const auto bad =
          std::find_if(counts.begin(), counts.end(), [](std::int64_t n) { return n < 1; });
      problem =
          fmt::format("entry {} is {}: every chunk needs a layer", bad - counts.begin() + 1, *bad);
    } else if (sum != config.model.n_layer) {
      problem = fmt::format("its entries sum to {}", sum);
    }
    if (!problem.empty()) {
      issues.push_back(
          {"parallel.pp_layers", p.pp_layers,
           fmt::format("must give the layers of each of the pp × virtual_stages = {} model chunks, "
                       "comma-separated, each ≥ 1, summing to model.n_layer = {}; {}",
                       chunks, config.model.n_layer, problem),
           fmt::format("set parallel.pp_layers = \"{}\", or \"\" for an even split",
                       fmt::join(std::vector<std::int64_t>(
                                     static_cast<std::size_t>(chunks),
                                     std::max<std::int64_t>(config.model.n_layer / chunks, 1)),
                                 ","))});
    }
    return;
  }
  if (config.model.n_layer < chunks) {
    issues.push_back(
        {"model.n_layer", fmt::format("{}", config.model.n_layer),
         fmt::format("must be ≥ pp × virtual_stages = {}: every model chunk needs a layer", chunks),
         fmt::format("use fewer pipeline stages or virtual stages, or ≥ {} layers", chunks)});
  }
}

}  // namespace meshtrain
