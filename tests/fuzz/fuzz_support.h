// tests/fuzz/fuzz_support.h
//
// What the fuzz targets share (docs/testing.md, "Fuzzing"). A target hands one input to a
// parser and accepts only meshtrain::Error (DataError, ConfigError) as the outcome of bad
// input: any other exception leaves LLVMFuzzerTestOneInput and ends the process
// (std::terminate), which libFuzzer and the replay runner (replay_main.cpp) report as a finding,
// as they do a crash, a sanitizer report or an allocation past libFuzzer's -malloc_limit_mb.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

#include "meshtrain/core/error.h"

namespace meshtrain::fuzz {

/// A directory of this process's own under the temporary directory, created on first use and
/// removed at exit: parsers that take a path read the input from a file in it.
const std::filesystem::path& scratch_dir();

/// Writes `bytes` to `path`, replacing it.
void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file(const std::filesystem::path& path, std::string_view text);

/// Runs `parse`; a meshtrain::Error is the clean refusal of a bad input, anything else escapes.
template <class Fn>
void refuse_cleanly(Fn&& parse) {
  try {
    parse();
  } catch (const Error&) {
  }
}

}  // namespace meshtrain::fuzz
