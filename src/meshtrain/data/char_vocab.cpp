#include "meshtrain/data/char_vocab.h"

#include <fmt/format.h>

#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain::data {

CharVocab::CharVocab() { id_of_byte_.fill(-1); }

CharVocab::CharVocab(std::vector<std::uint8_t> sorted_chars) : chars_(std::move(sorted_chars)) {
  id_of_byte_.fill(-1);
  for (std::size_t id = 0; id < chars_.size(); ++id) {
    id_of_byte_[chars_[id]] = static_cast<std::int16_t>(id);
  }
}

CharVocab CharVocab::from_text(std::string_view text) {
  std::array<bool, 256> present{};
  for (const char c : text) present[static_cast<std::uint8_t>(c)] = true;
  std::vector<std::uint8_t> chars;
  for (int byte = 0; byte < 256; ++byte) {
    if (present[static_cast<std::size_t>(byte)]) chars.push_back(static_cast<std::uint8_t>(byte));
  }
  return CharVocab(std::move(chars));
}

CharVocab CharVocab::from_chars(std::vector<std::uint8_t> chars) {
  if (chars.empty()) throw DataError("character vocabulary is empty: it needs at least one byte");
  for (std::size_t i = 1; i < chars.size(); ++i) {
    if (chars[i] <= chars[i - 1]) {
      throw DataError(
          fmt::format("character vocabulary is not strictly increasing: entry {} is {} after {}", i,
                      chars[i], chars[i - 1]));
    }
  }
  return CharVocab(std::move(chars));
}

std::vector<std::int32_t> CharVocab::encode(std::string_view text) const {
  std::vector<std::int32_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const std::uint8_t byte = static_cast<std::uint8_t>(text[i]);
    const std::int16_t id = id_of_byte_[byte];
    if (id < 0) {
      throw DataError(fmt::format(
          "character {} at position {} is not in the vocabulary of {} characters; encode only "
          "text made of the characters the dataset was prepared from",
          describe_byte(byte), i, chars_.size()));
    }
    ids[i] = id;
  }
  return ids;
}

std::string CharVocab::decode(std::span<const std::int32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size()) {
      throw DataError(fmt::format("token id {} at position {} is outside the vocabulary [0, {})",
                                  ids[i], i, chars_.size()));
    }
    text[i] = static_cast<char>(chars_[static_cast<std::size_t>(ids[i])]);
  }
  return text;
}

void CharTokenizer::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  const std::vector<std::int32_t> ids = vocab_.encode(text);
  out.insert(out.end(), ids.begin(), ids.end());
}

std::size_t CharTokenizer::encode_prefix(std::string_view text,
                                         std::vector<std::int32_t>& out) const {
  encode(text, out);
  return text.size();
}

std::string describe_byte(std::uint8_t byte) {
  if (byte >= 0x20 && byte < 0x7f)
    return fmt::format("'{}' (byte {})", static_cast<char>(byte), byte);
  return fmt::format("byte {:#04x}", byte);
}

}  // namespace meshtrain::data
