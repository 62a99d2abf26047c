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
  std::int32_t any = local ? 1 : 0;
  group.all_reduce_max(std::span<std::int32_t>(&any, 1));
  return any > 0;
}

std::string first_error(ProcessGroup& group, const std::string& local_error) {
  // The max of (size − rank) over failing ranks names the lowest failing rank.
  std::int32_t failing = local_error.empty() ? 0 : group.size() - group.rank();
  group.all_reduce_max(std::span<std::int32_t>(&failing, 1));
  if (failing == 0) return "";
  const int root = group.size() - failing;
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
  std::vector<std::int32_t> all(static_cast<std::size_t>(group.size()));
  const std::int32_t mine = std::max(priority, 0);
  group.all_gather(std::span<const std::int32_t>(&mine, 1), std::span<std::int32_t>(all));
  HighestReports out;
  out.priority = *std::max_element(all.begin(), all.end());
  if (out.priority == 0) return out;
  for (int r = 0; r < group.size(); ++r) {
    if (all[static_cast<std::size_t>(r)] != out.priority) continue;
    if (out.count++ >= limit) continue;
    out.reports.push_back(
        {group.world_ranks()[static_cast<std::size_t>(r)], broadcast_string(group, text, r)});
  }
  return out;
}

}  // namespace meshtrain
