// tests/dist/shared_dir.h — a fresh directory that every rank of a distributed test can read
// and write.
#pragma once

#include <stdlib.h>  // mkdtemp

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>

#include "meshtrain/comm/process_group.h"

namespace meshtrain::test {

/// Rank 0 creates `<parent>/<prefix>XXXXXX` and broadcasts the name, so every rank of `group`
/// gets the same path. parent is $MESHTRAIN_TEST_SHARED_DIR when set — a folder on a file
/// system all hosts see, as ranks on several hosts need (tests/multihost sets it; each of its
/// hosts has a /tmp of its own, as real nodes do) — else the system temp dir. "" when rank 0
/// could not create it (the caller's assertions then fail on every rank alike).
inline std::filesystem::path shared_temp_dir(ProcessGroup& group, const std::string& prefix) {
  std::string path;
  if (group.rank() == 0) {
    const char* shared = std::getenv("MESHTRAIN_TEST_SHARED_DIR");
    const std::filesystem::path parent = shared != nullptr && *shared != '\0'
                                             ? std::filesystem::path(shared)
                                             : std::filesystem::temp_directory_path();
    std::string pattern = (parent / (prefix + "XXXXXX")).string();
    path = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  std::int64_t n = static_cast<std::int64_t>(path.size());
  group.broadcast(std::as_writable_bytes(std::span<std::int64_t>(&n, 1)), 0);
  path.resize(static_cast<std::size_t>(n));
  group.broadcast(std::as_writable_bytes(std::span<char>(path)), 0);
  return path;
}

}  // namespace meshtrain::test
