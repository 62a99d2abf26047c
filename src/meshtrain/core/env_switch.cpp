#include "meshtrain/core/env_switch.h"

#include <cstdlib>
#include <string_view>

namespace meshtrain {

std::optional<ConfigIssue> env_switch_issue(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || std::string_view(text) == "0" || std::string_view(text) == "1") {
    return std::nullopt;
  }
  return ConfigIssue{name, fmt::format("'{}'", text), "an on/off switch must be 0 or 1",
                     fmt::format("export {}=0 (off) or 1 (on), or unset it", name)};
}

bool env_switch(const char* name, bool unset) {
  if (std::optional<ConfigIssue> issue = env_switch_issue(name)) {
    throw ConfigError("environment", {*std::move(issue)});
  }
  const char* text = std::getenv(name);
  return text == nullptr ? unset : std::string_view(text) == "1";
}

}  // namespace meshtrain
