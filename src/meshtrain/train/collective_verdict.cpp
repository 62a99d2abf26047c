#include "meshtrain/train/collective_verdict.h"

#include <fmt/format.h>

#include <cstdint>

namespace meshtrain {

std::string first_error(ProcessGroup& group, const std::string& local_error) {
  // The max of (size − rank) over failing ranks names the lowest failing rank.
  float failing = local_error.empty() ? 0.0f : static_cast<float>(group.size() - group.rank());
  group.all_reduce_max(std::span<float>(&failing, 1));
  if (failing == 0.0f) return "";
  const int root = group.size() - static_cast<int>(failing);
  std::string message = group.rank() == root ? local_error : std::string();
  std::int64_t length = static_cast<std::int64_t>(message.size());
  group.broadcast(std::as_writable_bytes(std::span<std::int64_t>(&length, 1)), root);
  message.resize(static_cast<std::size_t>(length));
  group.broadcast(std::as_writable_bytes(std::span<char>(message)), root);
  return fmt::format("rank {}: {}", group.world_ranks()[static_cast<std::size_t>(root)], message);
}

}  // namespace meshtrain
