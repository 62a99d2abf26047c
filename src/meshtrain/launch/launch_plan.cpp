#include "meshtrain/launch/launch_plan.h"

#include <fmt/format.h>
#include <string.h>  // strsignal (POSIX, not in <cstring>)

#include <charconv>

#include "meshtrain/core/exit_codes.h"
#include "meshtrain/core/restart_count.h"

namespace meshtrain {
namespace {

constexpr std::string_view kResumeKey = "--checkpoint.resume";

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  return value;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// The digits at the start of `s` (after blanks), as an int.
std::optional<int> leading_int(std::string_view s) {
  s = trim(s);
  std::size_t n = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
  return parse_int(s.substr(0, n));
}

}  // namespace

std::vector<std::string> with_resume_auto(const std::vector<std::string>& command) {
  std::vector<std::string> out;
  out.reserve(command.size() + 2);
  for (std::size_t i = 0; i < command.size(); ++i) {
    const std::string_view arg = command[i];
    if (arg == kResumeKey) {
      ++i;  // and its value, if any
      continue;
    }
    if (arg.starts_with(kResumeKey) && arg.size() > kResumeKey.size() &&
        arg[kResumeKey.size()] == '=') {
      continue;
    }
    out.push_back(command[i]);
  }
  out.emplace_back(kResumeKey);
  out.emplace_back("auto");
  return out;
}

std::vector<std::string> mpirun_argv(const LaunchPlan& plan, int restarts_done) {
  std::vector<std::string> argv = {plan.mpirun, "-np", std::to_string(plan.ranks)};
  if (plan.ranks > plan.cores) {
    // Functional runs with more ranks than cores: without these OpenMPI refuses to start
    // (--oversubscribe) or pins several ranks to one core (--bind-to none).
    argv.insert(argv.end(), {"--oversubscribe", "--bind-to", "none"});
  }
  argv.insert(argv.end(), {"-x", fmt::format("{}={}", kRestartCountEnv, restarts_done)});
  argv.insert(argv.end(), plan.mpirun_args.begin(), plan.mpirun_args.end());
  argv.push_back(plan.program);
  const std::vector<std::string> command =
      restarts_done > 0 ? with_resume_auto(plan.command) : plan.command;
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::optional<std::vector<std::string>> split_arguments(std::string_view text) {
  std::vector<std::string> out;
  std::string current;
  bool in_word = false;
  char quote = 0;
  for (const char c : text) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        current += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) out.push_back(std::move(current));
      current.clear();
      in_word = false;
    } else {
      current += c;
      in_word = true;
    }
  }
  if (quote != 0) return std::nullopt;
  if (in_word) out.push_back(std::move(current));
  return out;
}

void MpirunOutputScanner::feed(std::string_view chunk) {
  while (!chunk.empty()) {
    const std::size_t newline = chunk.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(chunk);
      return;
    }
    partial_.append(chunk.substr(0, newline));
    scan_line(partial_);
    partial_.clear();
    chunk.remove_prefix(newline + 1);
  }
}

void MpirunOutputScanner::finish() {
  if (!partial_.empty()) scan_line(partial_);
  partial_.clear();
}

void MpirunOutputScanner::scan_line(std::string_view line) {
  line = trim(line);
  // OpenMPI 4: "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9
  // (Killed)."
  constexpr std::string_view kNoticed = "noticed that process rank ";
  constexpr std::string_view kOnSignal = " exited on signal ";
  if (const std::size_t at = line.find(kNoticed); at != std::string_view::npos) {
    const std::string_view rest = line.substr(at + kNoticed.size());
    const std::size_t sig = rest.find(kOnSignal);
    if (!failed_.rank && sig != std::string_view::npos) {
      failed_.rank = leading_int(rest);
      std::string_view after = rest.substr(sig + kOnSignal.size());
      failed_.signal = leading_int(after);
      const std::size_t open = after.find('(');
      const std::size_t close = after.rfind(')');
      if (open != std::string_view::npos && close != std::string_view::npos && close > open) {
        failed_.signal_name = std::string(after.substr(open + 1, close - open - 1));
      }
    }
    return;
  }
  // "  Process name: [[12096,1],0]" then "  Exit code:    2" (first process with a non-zero
  // exit code).
  constexpr std::string_view kProcessName = "Process name:";
  constexpr std::string_view kExitCode = "Exit code:";
  if (line.starts_with(kProcessName)) {
    const std::size_t comma = line.rfind(',');
    const std::size_t close = line.rfind(']');
    pending_rank_.reset();
    if (comma != std::string_view::npos && close != std::string_view::npos && close > comma) {
      pending_rank_ = parse_int(line.substr(comma + 1, close - comma - 1));
    }
    return;
  }
  if (line.starts_with(kExitCode)) {
    if (!failed_.rank && pending_rank_) {
      failed_.rank = pending_rank_;
      failed_.exit_code = leading_int(line.substr(kExitCode.size()));
    }
    pending_rank_.reset();
    return;
  }
  if (line.starts_with("[watchdog] ending the job")) {
    failed_.watchdog = true;
    return;
  }
  if (line.find("was unable to launch the specified application") != std::string_view::npos ||
      line.find("was unable to find the specified executable") != std::string_view::npos) {
    failed_.launch_failed = true;
  }
}

std::string describe_failure(const AttemptStatus& status, const FailedRank& failed) {
  if (failed.launch_failed) return "mpirun could not start the program";
  if (failed.rank && failed.signal) {
    return failed.signal_name.empty()
               ? fmt::format("rank {} exited on signal {}", *failed.rank, *failed.signal)
               : fmt::format("rank {} exited on signal {} ({})", *failed.rank, *failed.signal,
                             failed.signal_name);
  }
  if (failed.rank && failed.exit_code) {
    return fmt::format("rank {} exited with code {}", *failed.rank, *failed.exit_code);
  }
  if (failed.watchdog) {
    return "a rank's watchdog ended the job (exit code 4: a communication operation timed out)";
  }
  if (status.signaled) {
    return fmt::format("mpirun was killed by signal {} ({})", status.code,
                       ::strsignal(status.code));
  }
  return fmt::format("mpirun exited with code {}", status.code);
}

RetryDecision decide_retry(const AttemptStatus& status, const FailedRank& failed, bool interrupted,
                           int restarts_done, int max_restarts) {
  if (!status.signaled && status.code == 0) return {.restart = false, .reason = "it succeeded"};
  // A rank's own exit code when mpirun named one, else mpirun's (it returns the first failed
  // rank's code).
  const int code = failed.exit_code ? *failed.exit_code : (status.signaled ? -1 : status.code);
  if (!failed.signal && code == kExitStoppedBySignal) {
    // Asked to stop (preemption, or a user), whether through the launcher or not: restarting
    // would defeat the stop.
    return {.restart = false,
            .reason = fmt::format(
                "exit code {} means the ranks received a stop signal and stopped after "
                "writing a checkpoint{}; to continue, run the job again with "
                "--checkpoint.resume auto",
                kExitStoppedBySignal, interrupted ? " (the launcher passed on its signal)" : "")};
  }
  if (interrupted) {
    return {.restart = false, .reason = "the launcher was interrupted and passed that on"};
  }
  if (failed.launch_failed) {
    return {.restart = false, .reason = "a restart cannot fix a program mpirun cannot start"};
  }
  if (!failed.signal && code == 2) {
    return {.restart = false,
            .reason =
                "exit code 2 means a bad configuration or arguments; a restart cannot fix "
                "it"};
  }
  if (!failed.signal && code == 3) {
    return {.restart = false,
            .reason = "exit code 3 means a bad data file; a restart cannot fix it"};
  }
  if (restarts_done >= max_restarts) {
    return {.restart = false,
            .reason = max_restarts == 0 ? std::string("restarts are off (--max-restarts 0)")
                                        : fmt::format("all {} restart{} used", max_restarts,
                                                      max_restarts == 1 ? "" : "s")};
  }
  return {.restart = true, .reason = ""};
}

}  // namespace meshtrain
