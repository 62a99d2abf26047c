#include "meshtrain/data/metadata.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "meshtrain/core/error.h"

namespace meshtrain::data {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::filesystem::path& path, std::string_view problem) {
  throw DataError(fmt::format("dataset metadata '{}' {}; rerun `meshtrain prepare` to rewrite it",
                              path.string(), problem));
}

const json& field(const json& doc, const char* key, const std::filesystem::path& path) {
  const auto it = doc.find(key);
  if (it == doc.end()) fail(path, fmt::format("has no \"{}\"", key));
  return *it;
}

std::int64_t count_field(const json& doc, const char* key, const std::filesystem::path& path) {
  const json& value = field(doc, key, path);
  if (!value.is_number_integer() || value.get<std::int64_t>() < 0) {
    fail(path, fmt::format("has \"{}\" = {}, expected an integer ≥ 0", key, value.dump()));
  }
  return value.get<std::int64_t>();
}

std::vector<std::uint8_t> chars_field(const json& doc, const std::filesystem::path& path) {
  const json& list = field(doc, "chars", path);
  if (!list.is_array()) fail(path, "has a \"chars\" that is not a list");
  std::vector<std::uint8_t> chars;
  for (const json& entry : list) {
    if (!entry.is_number_integer() || entry.get<std::int64_t>() < 0 ||
        entry.get<std::int64_t>() > 255) {
      fail(path, fmt::format("has \"chars\" entry {}, expected a byte value 0..255", entry.dump()));
    }
    chars.push_back(static_cast<std::uint8_t>(entry.get<std::int64_t>()));
  }
  return chars;
}

json parse_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened (is the path right, and was the dataset prepared?)");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    fail(path, fmt::format("is not valid JSON ({})", e.what()));
  }
}

}  // namespace

std::string metadata_to_json(const Metadata& meta) {
  const std::span<const std::uint8_t> chars = meta.vocab.chars();
  // ordered_json keeps the documented key order; one key per line with compact values keeps
  // the 65-entry "chars" list on one line instead of 65.
  nlohmann::ordered_json doc;
  doc["format"] = kCharFormat;
  doc["vocab_size"] = meta.vocab.size();
  doc["chars"] = std::vector<int>(chars.begin(), chars.end());
  doc["source"] = meta.source;
  doc["train_tokens"] = meta.train_tokens;
  doc["val_tokens"] = meta.val_tokens;
  std::string out = "{\n";
  std::size_t remaining = doc.size();
  for (const auto& [key, value] : doc.items()) {
    out += fmt::format("  {}: {}{}\n", json(key).dump(), value.dump(), --remaining > 0 ? "," : "");
  }
  return out + "}\n";
}

Metadata load_metadata(const std::filesystem::path& meta_json) {
  const json doc = parse_file(meta_json);
  if (!doc.is_object()) fail(meta_json, "is not a JSON object");
  const json& format = field(doc, "format", meta_json);
  if (!format.is_string() || format.get<std::string>() != kCharFormat) {
    fail(meta_json,
         fmt::format("has \"format\" = {}, expected \"{}\"", format.dump(), kCharFormat));
  }
  const json& source = field(doc, "source", meta_json);
  if (!source.is_string()) fail(meta_json, "has a \"source\" that is not a string");

  Metadata meta;
  meta.source = source.get<std::string>();
  meta.train_tokens = count_field(doc, "train_tokens", meta_json);
  meta.val_tokens = count_field(doc, "val_tokens", meta_json);
  const std::int64_t vocab_size = count_field(doc, "vocab_size", meta_json);
  std::vector<std::uint8_t> chars = chars_field(doc, meta_json);
  if (static_cast<std::int64_t>(chars.size()) != vocab_size) {
    fail(meta_json,
         fmt::format("lists {} \"chars\" but \"vocab_size\" = {}", chars.size(), vocab_size));
  }
  try {
    meta.vocab = CharVocab::from_chars(std::move(chars));
    meta.vocab_size = meta.vocab.size();
  } catch (const DataError& e) {
    fail(meta_json, e.what());
  }
  return meta;
}

}  // namespace meshtrain::data
