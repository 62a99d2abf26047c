#include "meshtrain/core/env_switch.h"

#include <cstdlib>
#include <string_view>
#include <utility>

namespace meshtrain {

ConfigIssue bad_env_switch(const char* name, std::string value) {
  return ConfigIssue{name, std::move(value), "an on/off switch must be 0 or 1, on every rank",
                     fmt::format("export {0}=0 (off) or 1 (on) for every rank (mpirun -x {0}), "
                                 "or unset it",
                                 name)};
}

std::optional<ConfigIssue> env_switch_issue(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || std::string_view(text) == "0" || std::string_view(text) == "1") {
    return std::nullopt;
  }
  return bad_env_switch(name, fmt::format("'{}'", text));
}

bool env_switch(const char* name, bool unset) {
  if (std::optional<ConfigIssue> issue = env_switch_issue(name)) {
    throw ConfigError("environment", {*std::move(issue)});
  }
  const char* text = std::getenv(name);
  return text == nullptr ? unset : std::string_view(text) == "1";
}

}  // namespace meshtrain
