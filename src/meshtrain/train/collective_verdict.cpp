#include "meshtrain/train/collective_verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "meshtrain/core/env_switch.h"

namespace meshtrain {
namespace {

// `text` of group rank `root`, on every rank.
std::string broadcast_string(ProcessGroup& group, const std::string& text, int root) {
  std::string out = group.rank() == root ? text : std::string();
  std::int64_t length = static_cast<std::int64_t>(out.size());
  group.broadcast(std::as_writable_bytes(std::span<std::int64_t>(&length, 1)), root);
  out.resize(static_cast<std::size_t>(length));
  group.broadcast(std::as_writable_bytes(std::span<char>(out)), root);
  return out;
}

}  // namespace

bool on_any_rank(ProcessGroup& group, bool local) {
  float any = local ? 1.0f : 0.0f;
  group.all_reduce_max(std::span<float>(&any, 1));
  return any > 0.0f;
}

std::string first_error(ProcessGroup& group, const std::string& local_error) {
  // The max of (size − rank) over failing ranks names the lowest failing rank.
  float failing = local_error.empty() ? 0.0f : static_cast<float>(group.size() - group.rank());
  group.all_reduce_max(std::span<float>(&failing, 1));
  if (failing == 0.0f) return "";
  const int root = group.size() - static_cast<int>(failing);
  const std::string message = broadcast_string(group, local_error, root);
  return fmt::format("rank {}: {}", group.world_ranks()[static_cast<std::size_t>(root)], message);
}

void check_environment_for_all(ProcessGroup& group) {
  const std::optional<ConfigIssue> issue = env_switch_issue(kShmAllReduceEnv);
  const std::string first = first_error(group, issue ? issue->value : "");
  if (first.empty()) return;
  throw ConfigError("the environment", {bad_env_switch(kShmAllReduceEnv, first)});
}

HighestReports reports_of_highest(ProcessGroup& group, int priority, const std::string& text,
                                  int limit) {
  std::vector<float> all(static_cast<std::size_t>(group.size()));
  const float mine = static_cast<float>(std::max(priority, 0));  // small integers: exact
  group.all_gather(std::span<const float>(&mine, 1), all);
  HighestReports out;
  out.priority = static_cast<int>(*std::max_element(all.begin(), all.end()));
  if (out.priority == 0) return out;
  for (int r = 0; r < group.size(); ++r) {
    if (static_cast<int>(all[static_cast<std::size_t>(r)]) != out.priority) continue;
    if (out.count++ >= limit) continue;
    out.reports.push_back(
        {group.world_ranks()[static_cast<std::size_t>(r)], broadcast_string(group, text, r)});
  }
  return out;
}

}  // namespace meshtrain
