// `meshtrain launch -n N [--max-restarts K] -- train <config> ...`: runs the training job under
// mpirun and restarts it from the newest complete checkpoint when a rank dies
// (docs/resilience.md, "Launcher"). Never initialises MPI: it supervises the job from outside.
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "meshtrain/apps/commands.h"
#include "meshtrain/launch/launch_plan.h"
#include "meshtrain/launch/supervisor.h"
#include "meshtrain/monitor/watchdog_dirs.h"

namespace meshtrain {
namespace {

// `name` itself when it holds a '/', else the first executable `name` on PATH; "" if none.
std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    return ::access(name.c_str(), X_OK) == 0 ? name : std::string();
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const std::size_t colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);
    const std::string candidate = fmt::format("{}/{}", dir.empty() ? "." : dir, name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return {};
    dirs.remove_prefix(colon + 1);
  }
}

std::string own_executable() {
  std::array<char, 4096> buffer{};
  const ssize_t n = ::readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  return n > 0 ? std::string(buffer.data(), static_cast<std::size_t>(n)) : std::string();
}

int usage_error(std::string_view message) {
  fmt::print(stderr,
             "meshtrain launch: {}\nusage: meshtrain launch -n N [--max-restarts K] [--grace S] "
             "[--restart-delay S] [--mpirun PATH] [--mpirun-args \"...\"] -- train <config> "
             "[--section.key value ...]\n",
             message);
  return 2;
}

}  // namespace

int run_launch(const LaunchArgs& args) {
  if (args.ranks < 1) return usage_error(fmt::format("-n must be at least 1, got {}", args.ranks));
  if (args.max_restarts < 0) {
    return usage_error(fmt::format("--max-restarts must be 0 or more, got {}", args.max_restarts));
  }
  if (!(args.grace_s > 0 && args.grace_s <= 3600)) {
    return usage_error(
        fmt::format("--grace must lie in (0, 3600] seconds, got {}; use 15", args.grace_s));
  }
  if (!(args.restart_delay_s >= 0 && args.restart_delay_s <= 3600)) {
    return usage_error(fmt::format("--restart-delay must lie in [0, 3600] seconds, got {}; use 1",
                                   args.restart_delay_s));
  }
  if (!args.separator) {
    return usage_error("missing `--` between the launcher's options and the job's command");
  }
  if (!args.unexpected.empty()) {
    return usage_error(fmt::format("unexpected '{}' before `--`: the job's command goes after `--`",
                                   args.unexpected.front()));
  }
  if (args.command.empty()) return usage_error("no command after `--`");
  if (args.command.front() != "train") {
    return usage_error(fmt::format(
        "the job's command must be `train` (got '{}'): only training resumes from checkpoints",
        args.command.front()));
  }
  const auto mpirun_args = split_arguments(args.mpirun_args);
  if (!mpirun_args) {
    return usage_error(fmt::format("--mpirun-args has an unclosed quote: {}", args.mpirun_args));
  }
  const std::string mpirun = find_executable(args.mpirun);
  if (mpirun.empty()) {
    return usage_error(
        args.mpirun.find('/') != std::string::npos
            ? fmt::format("--mpirun {} is not an executable file", args.mpirun)
            : fmt::format("{} not found on PATH; install OpenMPI or give its path with --mpirun",
                          args.mpirun));
  }
  const std::string program = own_executable();
  if (program.empty()) {
    fmt::print(stderr, "meshtrain launch: cannot read /proc/self/exe: {}\n", std::strerror(errno));
    return 1;
  }
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const LaunchPlan plan = {.ranks = args.ranks,
                           .cores = cores > 0 ? static_cast<int>(cores) : 1,
                           .mpirun = mpirun,
                           .mpirun_args = *mpirun_args,
                           .program = program,
                           .command = args.command};
  int code = 1;
  try {
    code = supervise(plan, args.max_restarts, {},
                     {.grace_s = args.grace_s, .restart_delay_s = args.restart_delay_s});
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshtrain launch: {}\n", e.what());
  }
  // The job has ended, its processes with it: an attempt that was killed left its watchdog
  // directory (the next attempt's rank 0 cleans it, but there may be none).
  watchdog_dirs::remove_stale(watchdog_dirs::parent());
  return code;
}

}  // namespace meshtrain
