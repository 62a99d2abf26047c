#include "fuzz_support.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>

namespace meshtrain::fuzz {
namespace {

// Removes the directory when the process exits normally (libFuzzer's -max_total_time, the
// replay runner); a crash leaves it for inspection.
struct ScratchDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / fmt::format("meshtrain-fuzz-{}", ::getpid());
  ScratchDir() { std::filesystem::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

const std::filesystem::path& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  // Not a finding: the harness itself failed (disk full), so it stops with the reason.
  if (!out) throw std::runtime_error(fmt::format("fuzz harness: cannot write {}", path.string()));
}

void write_file(const std::filesystem::path& path, std::string_view text) {
  write_file(path, std::as_bytes(std::span<const char>(text)));
}

}  // namespace meshtrain::fuzz
