#include "meshtrain/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace meshtrain {
namespace {
std::string& check_context() {
  static std::string context = "process";
  return context;
}
AbortHook& abort_hook() {
  static AbortHook hook = nullptr;
  return hook;
}
}  // namespace

std::string format_config_issues(std::string_view source, std::span<const ConfigIssue> issues) {
  std::string out = fmt::format("{} has {} problem{}; nothing was started.\n", source,
                                issues.size(), issues.size() == 1 ? "" : "s");
  for (const ConfigIssue& issue : issues) {
    out += fmt::format("\n  {} = {}\n    rule: {}\n    fix:  {}\n", issue.setting, issue.value,
                       issue.rule, issue.fix);
  }
  return out;
}

ConfigError::ConfigError(std::string source, std::vector<ConfigIssue> issues)
    : Error(format_config_issues(source, issues)), issues_(std::move(issues)) {}

void set_check_context(std::string context) { check_context() = std::move(context); }

void set_abort_hook(AbortHook hook) { abort_hook() = hook; }

void check_failed(std::string_view expr, const std::string& message, const char* file, int line) {
  std::fprintf(stderr, "meshtrain: %s check failed at %s:%d:\n  %.*s — %s\n",
               check_context().c_str(), file, line, static_cast<int>(expr.size()), expr.data(),
               message.c_str());
  std::fflush(stderr);
  if (abort_hook() != nullptr) abort_hook()();
  std::abort();
}

}  // namespace meshtrain
