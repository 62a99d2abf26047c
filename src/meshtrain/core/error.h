// src/meshtrain/core/error.h
//
// Error types chosen by who must act next (cf. Abseil's StatusCode guidance), and MT_CHECK
// for broken invariants. Uses: fmt. Knows nothing of ranks: the rank prefix of a failed
// check comes from a context string set once by the runtime (set_check_context).
#pragma once

#include <fmt/format.h>

#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One problem with a configuration: the setting, its value, the rule it breaks and a fix.
struct ConfigIssue {
  std::string setting;  // "parallel.dp"
  std::string value;    // "3"
  std::string rule;     // why it is invalid
  std::string fix;      // what to change
};

/// The user edits the config. Thrown before anything is allocated; carries every issue so one
/// run shows everything to fix. what() renders all issues.
class ConfigError : public Error {
 public:
  ConfigError(std::string source, std::vector<ConfigIssue> issues);
  std::span<const ConfigIssue> issues() const noexcept { return issues_; }

 private:
  std::vector<ConfigIssue> issues_;
};

/// A file is missing, unreadable or corrupt. Nothing was overwritten.
class DataError : public Error {
 public:
  using Error::Error;
};

/// A peer failed or timed out. The job must restart from the last checkpoint.
class CommError : public Error {
 public:
  using Error::Error;
};

/// A run-time failure every rank detected together from the same reduced value (a non-finite
/// loss or gradient norm): every rank stops with the same message, which names where the value
/// first appeared (train/non_finite_report.h).
class TrainingDiverged : public Error {
 public:
  using Error::Error;
};

/// Renders issues as the user reads them (STYLE example 6).
std::string format_config_issues(std::string_view source, std::span<const ConfigIssue> issues);

/// Sets the prefix MT_CHECK reports, e.g. "rank 3 (pp=0 dp=1 cp=0 tp=1)". Called once by the
/// runtime after the mesh is built; before that the prefix is "process".
void set_check_context(std::string context);

/// A broken invariant is a meshtrain bug: print context, file:line, the expression and the
/// message to stderr, then call the abort hook (the MPI runtime installs MPI_Abort; the default
/// is std::abort). Never caught, never compiled out.
[[noreturn]] void check_failed(std::string_view expr, const std::string& message, const char* file,
                               int line);

/// Replaces the function check_failed calls last (it must not return).
using AbortHook = void (*)();
void set_abort_hook(AbortHook hook);

}  // namespace meshtrain

// (__FILE__/__LINE__ rather than std::source_location: clang 14 here cannot compile it.)
#define MT_CHECK(cond, ...)                                                             \
  do {                                                                                  \
    if (!(cond)) [[unlikely]] {                                                         \
      ::meshtrain::check_failed(#cond, ::fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
    }                                                                                   \
  } while (false)
