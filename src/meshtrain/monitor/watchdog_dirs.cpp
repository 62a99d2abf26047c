#include "meshtrain/monitor/watchdog_dirs.h"

#include <fmt/format.h>
#include <stdlib.h>  // mkdtemp
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace meshtrain::watchdog_dirs {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kFormatLine = "meshtrain-watchdog-owner 1";

struct Owner {
  std::string host, boot;
  long long pid = 0;
  unsigned long long start = 0;
};

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string();
}

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  in >> id;
  return id;
}

struct ProcStat {
  char state = '?';
  unsigned long long start = 0;
};

// State and start time (fields 3 and 22 of /proc/<pid>/stat, proc(5)); none when no such
// process exists.
std::optional<ProcStat> proc_stat(long long pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Field 2, the command name in parentheses, may itself hold spaces and parentheses.
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(text.substr(close + 1));
  ProcStat s;
  rest >> s.state;
  std::string skipped;
  for (int field = 4; field <= 21; ++field) rest >> skipped;
  if (!(rest >> s.start)) return std::nullopt;
  return s;
}

std::optional<Owner> read_owner(const fs::path& dir) {
  std::ifstream in(dir / kOwnerFile);
  std::string line;
  if (!std::getline(in, line) || line != kFormatLine) return std::nullopt;
  Owner o;
  int fields = 0;
  for (std::string key; in >> key;) {
    if (key == "host" && in >> o.host) ++fields;
    if (key == "boot" && in >> o.boot) ++fields;
    if (key == "pid" && in >> o.pid) ++fields;
    if (key == "start" && in >> o.start) ++fields;
  }
  if (fields != 4 || o.pid <= 0) return std::nullopt;
  return o;
}

// Only a directory of this host is judged; see the header for the rule.
bool owner_gone(const Owner& o, const std::string& host, const std::string& boot) {
  if (o.host != host) return false;
  if (o.boot != boot) return true;
  const std::optional<ProcStat> s = proc_stat(o.pid);
  return !s || s->state == 'Z' || s->start != o.start;
}

}  // namespace

std::string parent() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? std::string(tmp) : std::string("/tmp");
}

std::string create(const std::string& parent_dir) {
  std::string dir = fmt::format("{}/{}XXXXXX", parent_dir, kPrefix);
  if (::mkdtemp(dir.data()) == nullptr) return "";
  // Without /proc this process's start time is unknown, and so would be whether the owner
  // lives: then no owner file, and the directory is never judged (as before owners existed).
  const std::optional<ProcStat> self = proc_stat(::getpid());
  if (!self) return dir;
  const fs::path owner = fs::path(dir) / kOwnerFile;
  std::ofstream out(owner);
  out << kFormatLine << "\nhost " << host_name() << "\nboot " << boot_id() << "\npid " << ::getpid()
      << "\nstart " << self->start << "\n";
  if (!out.flush()) {
    std::error_code ec;
    fs::remove(owner, ec);  // a partial record must not be read
  }
  return dir;
}

void remove_job_files(const std::string& dir) noexcept {
  try {
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const fs::path& p = entry.path();
      if (p.extension() == ".progress" || p.filename() == kOwnerFile) files.push_back(p);
    }
    for (const fs::path& p : files) fs::remove(p, ec);
    fs::remove(dir, ec);  // fails, and keeps the flight-recorder dumps, when any are left
  } catch (...) {         // a path or allocation failure: leave the directory as it is
  }
}

int remove_stale(const std::string& parent_dir) noexcept {
  try {
    const std::string host = host_name(), boot = boot_id();
    std::error_code ec;
    std::vector<fs::path> stale;
    for (const auto& entry : fs::directory_iterator(parent_dir, ec)) {
      const std::string name = entry.path().filename().string();
      // symlink_status: a link planted under this name is never followed.
      if (!name.starts_with(kPrefix) || !fs::is_directory(entry.symlink_status(ec))) continue;
      const std::optional<Owner> owner = read_owner(entry.path());
      if (owner && owner_gone(*owner, host, boot)) stale.push_back(entry.path());
    }
    for (const fs::path& dir : stale) remove_job_files(dir.string());
    return static_cast<int>(stale.size());
  } catch (...) {
    return 0;
  }
}

}  // namespace meshtrain::watchdog_dirs
