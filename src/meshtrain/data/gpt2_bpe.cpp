#include "meshtrain/data/gpt2_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/data/tokenizer_files.h"

namespace meshtrain::data {
namespace {

// Code points of a UTF-8 string that nlohmann::json has already validated.
std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
    char32_t cp = len == 1 ? b : len == 2 ? b & 0x1f : len == 3 ? b & 0x0f : b & 0x07;
    for (int k = 1; k < len && i + k < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    }
    out.push_back(cp);
    i += static_cast<std::size_t>(len);
  }
  return out;
}

// Length of an incomplete UTF-8 sequence at the end of `text` (0..3): bytes a continuation of
// the text could complete into one character, so the regex must not see them cut off yet.
std::size_t incomplete_tail(std::string_view text) {
  for (std::size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const auto b = static_cast<unsigned char>(text[text.size() - back]);
    if ((b & 0xc0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

std::array<char32_t, 256> gpt2_byte_to_unicode() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    map[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

struct Gpt2Pretokenizer::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Gpt2Pretokenizer::Gpt2Pretokenizer() : code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern.data()), kGpt2Pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  MT_CHECK(code_->code != nullptr, "PCRE2 rejected GPT-2's pattern (error {} at {})", error,
           offset);
  // Without a JIT (some architectures) the interpreter gives the same matches, slower.
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
}

Gpt2Pretokenizer::~Gpt2Pretokenizer() = default;

void Gpt2Pretokenizer::split(std::string_view text, std::vector<Gpt2Piece>& out) const {
  // Match data per call keeps one compiled pattern usable from several threads.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), at, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      out.push_back({at, text.size()});  // trailing invalid UTF-8
      return;
    }
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      throw DataError(fmt::format("GPT-2 pre-tokenising failed at byte {}: PCRE2 says {}", at,
                                  reinterpret_cast<const char*>(message.data())));
    }
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match.get());
    if (range[0] > at) out.push_back({at, range[0]});  // invalid UTF-8 between matches
    out.push_back({range[0], range[1]});
    at = range[1];
  }
}

namespace {

DataError bad_file(const std::filesystem::path& path, const std::string& problem) {
  return DataError(
      fmt::format("GPT-2 tokenizer file '{}' {}; expected OpenAI's GPT-2 "
                  "encoder.json and vocab.bpe (data/tokenizers/gpt2)",
                  path.string(), problem));
}

// The bytes a byte-map spelling stands for; nullopt when a code point is not in the map.
std::optional<std::string> spelled_bytes(std::string_view spelled,
                                         const std::unordered_map<char32_t, char>& byte_of) {
  std::string bytes;
  for (const char32_t cp : code_points(spelled)) {
    const auto it = byte_of.find(cp);
    if (it == byte_of.end()) return std::nullopt;
    bytes.push_back(it->second);
  }
  return bytes;
}

}  // namespace

Gpt2Bpe::Gpt2Bpe(std::string_view encoder_json, std::string_view vocab_bpe,
                 const std::filesystem::path& encoder_path,
                 const std::filesystem::path& merges_path)
    : encoder_json_(encoder_json), vocab_bpe_(vocab_bpe) {
  std::unordered_map<char32_t, char> byte_of;
  const std::array<char32_t, 256> to_unicode = gpt2_byte_to_unicode();
  for (int b = 0; b < 256; ++b)
    byte_of[to_unicode[static_cast<std::size_t>(b)]] = static_cast<char>(b);
  read_encoder(encoder_path, byte_of);
  read_merges(merges_path, byte_of);
}

void Gpt2Bpe::read_encoder(const std::filesystem::path& path,
                           const std::unordered_map<char32_t, char>& byte_of) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(encoder_json_);
  } catch (const nlohmann::json::exception& e) {
    throw bad_file(path, fmt::format("is not valid JSON ({})", e.what()));
  }
  if (!doc.is_object() || doc.empty()) throw bad_file(path, "is not a JSON object of tokens");
  token_bytes_.assign(doc.size(), std::string());
  std::vector<bool> seen(doc.size(), false);
  eot_id_ = -1;
  for (const auto& [token, value] : doc.items()) {
    if (!value.is_number_integer() || value.get<std::int64_t>() < 0 ||
        value.get<std::int64_t>() >= static_cast<std::int64_t>(doc.size()) ||
        seen[value.get<std::size_t>()]) {
      throw bad_file(path, fmt::format("maps {} to {}, expected distinct ids 0..{}",
                                       nlohmann::json(token).dump(), value.dump(), doc.size() - 1));
    }
    const auto id = value.get<std::int32_t>();
    seen[static_cast<std::size_t>(id)] = true;
    if (token == "<|endoftext|>") {  // special: decodes to its text, never encoded
      eot_id_ = id;
      token_bytes_[static_cast<std::size_t>(id)] = token;
      continue;
    }
    std::optional<std::string> bytes = spelled_bytes(token, byte_of);
    if (!bytes) {
      throw bad_file(path, fmt::format("has token {} with a code point outside GPT-2's byte map",
                                       nlohmann::json(token).dump()));
    }
    token_bytes_[static_cast<std::size_t>(id)] = *bytes;
    id_of_.emplace(std::move(*bytes), id);
  }
  if (eot_id_ < 0) throw bad_file(path, "has no \"<|endoftext|>\" token");
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of_.find(std::string(1, static_cast<char>(b)));
    if (it == id_of_.end()) throw bad_file(path, fmt::format("has no token for byte {}", b));
    byte_id_[static_cast<std::size_t>(b)] = it->second;
  }
}

void Gpt2Bpe::read_merges(const std::filesystem::path& path,
                          const std::unordered_map<char32_t, char>& byte_of) {
  const auto id_of = [&](std::string_view spelled) -> std::int32_t {
    const std::optional<std::string> bytes = spelled_bytes(spelled, byte_of);
    const auto found = bytes ? id_of_.find(*bytes) : id_of_.end();
    return found == id_of_.end() ? -1 : found->second;
  };
  const std::string_view text = vocab_bpe_;
  std::int32_t rank = 0;
  std::size_t line_no = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const std::size_t space = line.find(' ');
    const std::string_view a = line.substr(0, space);
    const std::string_view b = space == std::string_view::npos ? "" : line.substr(space + 1);
    const std::int32_t left = id_of(a);
    const std::int32_t right = id_of(b);
    const std::int32_t merged = left < 0 || right < 0 ? -1 : id_of(std::string(a) + std::string(b));
    if (space == std::string_view::npos || merged < 0) {
      // {:?} quotes and escapes any bytes; a JSON dump would throw on invalid UTF-8.
      throw bad_file(path, fmt::format("line {} is {:?}, expected \"a b\" with a, b and ab tokens "
                                       "of encoder.json",
                                       line_no, line));
    }
    merges_.emplace((static_cast<std::uint64_t>(left) << 32) | static_cast<std::uint32_t>(right),
                    Merge{rank++, merged});
  }
  if (merges_.empty()) throw bad_file(path, "has no merges");
}

std::unique_ptr<Gpt2Bpe> Gpt2Bpe::load(const std::filesystem::path& dir) {
  const std::filesystem::path encoder = dir / "encoder.json";
  const std::filesystem::path merges = dir / "vocab.bpe";
  return std::make_unique<Gpt2Bpe>(read_tokenizer_file(encoder, "GPT-2 encoder.json"),
                                   read_tokenizer_file(merges, "GPT-2 vocab.bpe"), encoder, merges);
}

void Gpt2Bpe::encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  // A doubly linked list of parts and a min-heap of (rank, left part) candidates: the pair of
  // lowest rank, leftmost on a tie, is merged first, exactly as rescanning all pairs would do,
  // in O(n log n) rather than O(n²) — a piece can be megabytes (a run of spaces). A heap entry
  // whose pair has changed since it was pushed no longer has its rank and is skipped.
  const auto n = static_cast<std::int32_t>(piece.size());
  std::vector<std::int32_t> id(piece.size());
  std::vector<std::int32_t> next(piece.size());
  std::vector<std::int32_t> prev(piece.size());
  for (std::int32_t i = 0; i < n; ++i) {
    id[static_cast<std::size_t>(i)] =
        byte_id_[static_cast<unsigned char>(piece[static_cast<std::size_t>(i)])];
    next[static_cast<std::size_t>(i)] = i + 1 < n ? i + 1 : -1;
    prev[static_cast<std::size_t>(i)] = i - 1;
  }
  const auto merge_of = [&](std::int32_t left) -> const Merge* {
    const std::int32_t right = next[static_cast<std::size_t>(left)];
    if (right < 0) return nullptr;
    const auto it =
        merges_.find((static_cast<std::uint64_t>(id[static_cast<std::size_t>(left)]) << 32) |
                     static_cast<std::uint32_t>(id[static_cast<std::size_t>(right)]));
    return it == merges_.end() ? nullptr : &it->second;
  };
  using Candidate = std::pair<std::int32_t, std::int32_t>;  // (rank, left part)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](std::int32_t left) {
    if (left < 0) return;
    if (const Merge* m = merge_of(left)) heap.emplace(m->rank, left);
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> gone(piece.size(), false);
  while (!heap.empty()) {
    const auto [rank, left] = heap.top();
    heap.pop();
    const Merge* m = gone[static_cast<std::size_t>(left)] ? nullptr : merge_of(left);
    if (m == nullptr || m->rank != rank) continue;  // stale
    const std::int32_t right = next[static_cast<std::size_t>(left)];
    id[static_cast<std::size_t>(left)] = m->id;
    gone[static_cast<std::size_t>(right)] = true;
    next[static_cast<std::size_t>(left)] = next[static_cast<std::size_t>(right)];
    if (next[static_cast<std::size_t>(right)] >= 0)
      prev[static_cast<std::size_t>(next[static_cast<std::size_t>(right)])] = left;
    push(prev[static_cast<std::size_t>(left)]);
    push(left);
  }
  for (std::int32_t i = n > 0 ? 0 : -1; i >= 0; i = next[static_cast<std::size_t>(i)]) {
    out.push_back(id[static_cast<std::size_t>(i)]);
  }
}

void Gpt2Bpe::encode_pieces(std::string_view text, std::span<const Gpt2Piece> pieces,
                            std::vector<std::int32_t>& out) const {
  for (const Gpt2Piece& p : pieces) {
    const std::string_view piece = text.substr(p.begin, p.end - p.begin);
    // A piece that is itself a token needs no merging (tiktoken's shortcut; same ids).
    const auto whole = id_of_.find(std::string(piece));
    if (whole != id_of_.end()) {
      out.push_back(whole->second);
    } else {
      encode_piece(piece, out);
    }
  }
}

void Gpt2Bpe::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  std::vector<Gpt2Piece> pieces;
  pretokenizer_.split(text, pieces);
  encode_pieces(text, pieces, out);
}

std::size_t Gpt2Bpe::encode_prefix(std::string_view text, std::vector<std::int32_t>& out) const {
  const std::size_t limit = text.size() - incomplete_tail(text);
  std::vector<Gpt2Piece> pieces;
  pretokenizer_.split(text.substr(0, limit), pieces);
  std::size_t final_count = 0;
  while (final_count + 1 < pieces.size() && pieces[final_count].begin + 3 <= limit) ++final_count;
  encode_pieces(text, std::span<const Gpt2Piece>(pieces).first(final_count), out);
  return final_count == 0 ? 0 : pieces[final_count].begin;
}

std::string Gpt2Bpe::decode(std::span<const std::int32_t> ids) const {
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      throw DataError(
          fmt::format("token id {} at position {} is outside GPT-2's vocabulary [0, {})", ids[i], i,
                      vocab_size()));
    }
    text += token_bytes_[static_cast<std::size_t>(ids[i])];
  }
  return text;
}

void Gpt2Bpe::save_files(const std::filesystem::path& dir) const {
  StagedFile(dir / "encoder.json", std::as_bytes(std::span<const char>(encoder_json_))).commit();
  StagedFile(dir / "vocab.bpe", std::as_bytes(std::span<const char>(vocab_bpe_))).commit();
}

}  // namespace meshtrain::data
