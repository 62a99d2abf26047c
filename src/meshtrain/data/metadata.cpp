#include "meshtrain/data/metadata.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/core/file_name.h"

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

std::string string_field(const json& doc, const char* key, const std::filesystem::path& path) {
  const json& value = field(doc, key, path);
  if (!value.is_string()) fail(path, fmt::format("has a \"{}\" that is not a string", key));
  return value.get<std::string>();
}

std::vector<std::string> strings_field(const json& doc, const char* key,
                                       const std::filesystem::path& path) {
  const json& list = field(doc, key, path);
  if (!list.is_array()) fail(path, fmt::format("has a \"{}\" that is not a list", key));
  std::vector<std::string> out;
  for (const json& entry : list) {
    if (!entry.is_string()) fail(path, fmt::format("has a \"{}\" entry that is not a string", key));
    out.push_back(entry.get<std::string>());
  }
  return out;
}

// The char vocabulary from "chars", checked against "vocab_size".
CharVocab char_vocab(const json& holder, std::int64_t vocab_size,
                     const std::filesystem::path& path) {
  std::vector<std::uint8_t> chars = chars_field(holder, path);
  if (static_cast<std::int64_t>(chars.size()) != vocab_size) {
    fail(path, fmt::format("lists {} \"chars\" but \"vocab_size\" = {}", chars.size(), vocab_size));
  }
  try {
    return CharVocab::from_chars(std::move(chars));
  } catch (const DataError& e) {
    fail(path, e.what());
  }
}

void load_v1(const json& doc, const std::filesystem::path& path, Metadata& meta) {
  meta.sources = {string_field(doc, "source", path)};
  meta.vocab_size = count_field(doc, "vocab_size", path);
  meta.vocab = char_vocab(doc, meta.vocab_size, path);
}

// A tokenizer file name must be a plain name: a hostile meta.json cannot point outside its
// directory (a checkpoint copies these files).
void check_file_name(const std::string& name, const std::filesystem::path& path) {
  if (!is_plain_file_name(name)) {
    fail(path,
         fmt::format("names tokenizer file {}, expected a plain file name", json(name).dump()));
  }
}

void load_v2(const json& doc, const std::filesystem::path& path, Metadata& meta) {
  const json& tokenizer = field(doc, "tokenizer", path);
  if (!tokenizer.is_object()) fail(path, "has a \"tokenizer\" that is not an object");
  const std::string kind = string_field(tokenizer, "kind", path);
  meta.vocab_size = count_field(doc, "vocab_size", path);
  if (kind == "char") {
    meta.tokenizer = TokenizerKind::char_bytes;
    meta.vocab = char_vocab(tokenizer, meta.vocab_size, path);
  } else if (kind == "gpt2" || kind == "sentencepiece") {
    meta.tokenizer = kind == "gpt2" ? TokenizerKind::gpt2_bpe : TokenizerKind::sentencepiece;
    meta.tokenizer_files = strings_field(tokenizer, "files", path);
    for (const std::string& name : meta.tokenizer_files) check_file_name(name, path);
  } else {
    fail(path, fmt::format("has tokenizer kind {}, expected \"char\", \"gpt2\" or "
                           "\"sentencepiece\"",
                           json(kind).dump()));
  }
  const std::string dtype = string_field(doc, "token_dtype", path);
  if (dtype != "uint16" && dtype != "uint32") {
    fail(path, fmt::format("has \"token_dtype\" = {}, expected \"uint16\" or \"uint32\"",
                           json(dtype).dump()));
  }
  meta.token_dtype = dtype == "uint16" ? TokenDtype::u16 : TokenDtype::u32;
  const json& eot = field(doc, "eot_id", path);
  if (!eot.is_null()) {
    if (!eot.is_number_integer() || eot.get<std::int64_t>() < 0 ||
        eot.get<std::int64_t>() >= meta.vocab_size) {
      fail(path, fmt::format("has \"eot_id\" = {}, expected null or an id below \"vocab_size\"",
                             eot.dump()));
    }
    meta.eot_id = eot.get<std::int32_t>();
  }
  meta.sources = strings_field(doc, "sources", path);
  const json& separator = field(doc, "document_separator", path);
  if (!separator.is_null() && !separator.is_string()) {
    fail(path, "has a \"document_separator\" that is neither null nor a string");
  }
  meta.document_separator = separator.is_string() ? separator.get<std::string>() : "";
  const json& fraction = field(doc, "val_fraction", path);
  if (!fraction.is_number() || !(fraction.get<double>() > 0.0 && fraction.get<double>() < 1.0)) {
    fail(path,
         fmt::format("has \"val_fraction\" = {}, expected a number in (0, 1)", fraction.dump()));
  }
  meta.val_fraction = fraction.get<double>();
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

std::string_view token_dtype_name(TokenDtype dtype) noexcept {
  return dtype == TokenDtype::u16 ? "uint16" : "uint32";
}

std::string metadata_to_json(const Metadata& meta) {
  // ordered_json keeps the documented key order; one key per line with compact values keeps
  // the 65-entry "chars" list on one line instead of 65.
  nlohmann::ordered_json tokenizer;
  tokenizer["kind"] = tokenizer_kind_name(meta.tokenizer);
  if (meta.tokenizer == TokenizerKind::char_bytes) {
    const std::span<const std::uint8_t> chars = meta.vocab.chars();
    tokenizer["chars"] = std::vector<int>(chars.begin(), chars.end());
  } else {
    tokenizer["files"] = meta.tokenizer_files;
  }
  nlohmann::ordered_json doc;
  doc["format"] = kTokensFormat;
  doc["tokenizer"] = tokenizer;
  doc["vocab_size"] = meta.vocab_size;
  doc["token_dtype"] = token_dtype_name(meta.token_dtype);
  doc["eot_id"] = meta.eot_id ? json(*meta.eot_id) : json(nullptr);
  doc["sources"] = meta.sources;
  doc["document_separator"] =
      meta.document_separator.empty() ? json(nullptr) : json(meta.document_separator);
  doc["val_fraction"] = meta.val_fraction;
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
  const std::string format = string_field(doc, "format", meta_json);
  Metadata meta;
  if (format == kTokensFormat) {
    load_v2(doc, meta_json, meta);
  } else if (format == kCharFormat) {
    load_v1(doc, meta_json, meta);
  } else {
    fail(meta_json, fmt::format("has \"format\" = {}, expected \"{}\" (or the older \"{}\")",
                                json(format).dump(), kTokensFormat, kCharFormat));
  }
  meta.train_tokens = count_field(doc, "train_tokens", meta_json);
  meta.val_tokens = count_field(doc, "val_tokens", meta_json);
  return meta;
}

}  // namespace meshtrain::data
