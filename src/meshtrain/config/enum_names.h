// src/meshtrain/config/enum_names.h
//
// The settings that name one of a few choices are scoped enums, parsed from their names once
// when the config is loaded (config/load.cpp). Each has ONE name table (config.h, and
// layer_modes.h for the three that layers/ reads): `to_string`, `parse_enum` and the loader's
// "allowed names" all read it, and configs, checkpoints, logs and metrics keep writing the
// names (never the numbers).
#pragma once

#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace meshtrain {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;  // what TOML, the command line and every file write
  std::string_view what;  // a few words for error messages
};

/// A config enum: one with a name table (an `enum_names` overload).
template <typename E>
concept ConfigEnum = std::is_enum_v<E> && requires(E e) {
  enum_names(e);
};

/// The name a setting's value is written as ("1f1b", "bf16", ...).
template <ConfigEnum E>
constexpr std::string_view to_string(E value) {
  for (const auto& entry : enum_names(value)) {
    if (entry.value == value) return entry.name;
  }
  return "?";  // unreachable: every enumerator has a row
}

/// The value named `name` (exact, case-sensitive), or nullopt.
template <ConfigEnum E>
constexpr std::optional<E> parse_enum(std::string_view name) {
  for (const auto& entry : enum_names(E{})) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}

/// Streams write the name too (test messages, logs).
template <ConfigEnum E>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << to_string(value);
}

/// "p2p (ring attention), a2a (Ulysses all-to-all)" — the allowed names, for error messages.
template <ConfigEnum E>
std::string allowed_names() {
  std::string out;
  for (const auto& entry : enum_names(E{})) {
    if (!out.empty()) out += ", ";
    out += std::string(entry.name) + " (" + std::string(entry.what) + ")";
  }
  return out;
}

// nlohmann::json finds these by argument-dependent lookup, so a config enum put into JSON
// (checkpoint metadata, metrics, dumps) is written and read as its name; without them nlohmann
// would silently write the enumerator's number. One pair per enum: a template only on the JSON
// type (config/ needs no JSON header) is more specialised than nlohmann's own enum conversion.
template <typename Json, ConfigEnum E>
void enum_to_json(Json& j, E value) {
  j = std::string(to_string(value));
}
template <typename Json, ConfigEnum E>
void enum_from_json(const Json& j, E& value) {
  const std::string name = j.template get<std::string>();
  const std::optional<E> parsed = parse_enum<E>(name);
  if (!parsed) {
    throw std::invalid_argument("unknown name \"" + name + "\"; allowed: " + allowed_names<E>());
  }
  value = *parsed;
}

// One to_json / from_json pair per config enum, next to its name table.
#define MESHTRAIN_CONFIG_ENUM_JSON(E)       \
  template <typename Json>                  \
  void to_json(Json& j, E value) {          \
    enum_to_json(j, value);                 \
  }                                         \
  template <typename Json>                  \
  void from_json(const Json& j, E& value) { \
    enum_from_json(j, value);               \
  }

}  // namespace meshtrain
