// src/meshtrain/config/load.h — reading a Config from TOML text and command-line overrides.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

/// A `--section.key value` pair from the command line, without the leading dashes.
using Override = std::pair<std::string, std::string>;

/// Parses TOML text onto the defaults, then applies overrides in order.
/// Throws ConfigError listing every unknown key (with the nearest known key as the fix), every
/// value of the wrong type, and TOML syntax errors (with line and column). `source` names the
/// text in messages.
Config load_config_text(const std::string& toml_text, const std::string& source,
                        const std::vector<Override>& overrides = {});

/// Reads `path` and calls load_config_text. A missing or unreadable file is a ConfigError.
Config load_config_file(const std::filesystem::path& path,
                        const std::vector<Override>& overrides = {});

/// Splits `--a.b v --c.d=w` style arguments into overrides; throws ConfigError for an argument
/// that is not of that form or lacks a value.
std::vector<Override> parse_overrides(const std::vector<std::string>& args);

/// Every key as TOML text with its current value (the run log and checkpoints record it).
std::string to_toml(const Config& config);

/// The config text a checkpoint stores: to_toml with [fault_injection] at its defaults. A
/// rehearsed fault belongs to the run that rehearsed it, not to the training state, so
/// resuming, resharding or sampling from the checkpoint never replays it or refuses it (a
/// fault's rank may not exist in the new world).
std::string checkpoint_toml(const Config& config);

}  // namespace meshtrain
