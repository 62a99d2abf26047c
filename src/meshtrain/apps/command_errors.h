// src/meshtrain/apps/command_errors.h — the exit codes of the commands that run in one process
// without MPI (sample, export, reshard): one place that turns their errors into messages.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string_view>

#include "meshtrain/core/error.h"

namespace meshtrain {

/// Runs `body` (which returns the exit code) and maps what it throws: ConfigError → 2,
/// DataError → 3, each printed to stderr as "meshtrain <command>: <message>" (apps/main.cpp lists
/// the codes). Anything else propagates.
template <typename Body>
int run_with_exit_codes(std::string_view command, Body&& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    fmt::print(stderr, "meshtrain {}: {}", command, e.what());  // ends with a newline itself
    return 2;
  } catch (const DataError& e) {
    fmt::print(stderr, "meshtrain {}: {}\n", command, e.what());
    return 3;
  }
}

}  // namespace meshtrain
