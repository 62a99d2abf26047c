#include "meshtrain/data/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <system_error>

#include "meshtrain/core/error.h"
#include "meshtrain/data/char_vocab.h"
#include "meshtrain/data/gpt2_bpe.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/sentencepiece_tokenizer.h"
#include "meshtrain/data/tokenizer_files.h"

namespace meshtrain::data {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kExpected =
    "expected \"char\", \"gpt2\" (the shipped data/tokenizers/gpt2), a directory holding "
    "GPT-2's encoder.json + vocab.bpe, or a SentencePiece .model file";

bool is_gpt2_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "encoder.json", ec) &&
         fs::is_regular_file(dir / "vocab.bpe", ec);
}

// data/tokenizers/gpt2 from the current directory (a checkout), else from the source tree
// the binary was built from (a build directory elsewhere, CTest).
fs::path shipped_gpt2_dir() {
  const fs::path relative = fs::path("data") / "tokenizers" / "gpt2";
  if (is_gpt2_dir(relative)) return relative;
  const fs::path in_source = fs::path(MESHTRAIN_SOURCE_DIR) / relative;
  if (is_gpt2_dir(in_source)) return in_source;
  throw DataError(fmt::format(
      "tokenizer \"gpt2\": neither {} nor {} holds encoder.json + vocab.bpe; run from the "
      "meshtrain checkout or pass the directory of GPT-2's files to --tokenizer",
      relative.string(), in_source.string()));
}

}  // namespace

std::size_t Tokenizer::encode_prefix(std::string_view, std::vector<std::int32_t>&) const {
  return 0;
}

std::string_view tokenizer_kind_name(TokenizerKind kind) noexcept {
  switch (kind) {
    case TokenizerKind::char_bytes:
      return "char";
    case TokenizerKind::gpt2_bpe:
      return "gpt2";
    case TokenizerKind::sentencepiece:
      return "sentencepiece";
  }
  return "?";
}

std::string read_tokenizer_file(const fs::path& path, std::string_view what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw DataError(fmt::format("{} '{}' {}; {}", what, path.string(),
                                fs::exists(path, ec) ? "is not a regular file" : "does not exist",
                                kExpected));
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (!in.good() && !in.eof()) {
    throw DataError(fmt::format("cannot read {} '{}'; check its permissions", what, path.string()));
  }
  return bytes;
}

std::unique_ptr<Tokenizer> open_tokenizer(std::string_view name, const CharVocab* corpus_chars) {
  if (name == "char") {
    MT_CHECK(corpus_chars != nullptr, "the char tokenizer needs the corpus's bytes");
    return std::make_unique<CharTokenizer>(*corpus_chars);
  }
  if (name == "gpt2") return Gpt2Bpe::load(shipped_gpt2_dir());
  const fs::path path(name);
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (!is_gpt2_dir(path)) {
      throw DataError(fmt::format("tokenizer directory '{}' holds no encoder.json + vocab.bpe; {}",
                                  path.string(), kExpected));
    }
    return Gpt2Bpe::load(path);
  }
  if (path.extension() == ".model") return SentencePieceTokenizer::load(path);
  throw DataError(fmt::format("unknown tokenizer '{}'{}; {}", name,
                              fs::exists(path, ec) ? " (a file, but not a .model)" : "",
                              kExpected));
}

std::unique_ptr<Tokenizer> load_tokenizer(const Metadata& meta, const fs::path& dir) {
  std::unique_ptr<Tokenizer> tokenizer;
  switch (meta.tokenizer) {
    case TokenizerKind::char_bytes:
      tokenizer = std::make_unique<CharTokenizer>(meta.vocab);
      break;
    case TokenizerKind::gpt2_bpe:
      tokenizer = Gpt2Bpe::load(dir);
      break;
    case TokenizerKind::sentencepiece:
      tokenizer = SentencePieceTokenizer::load(dir / "tokenizer.model");
      break;
  }
  // The checkpoint copies meta.json's file list: it must be the files this kind reads.
  if (meta.tokenizer != TokenizerKind::char_bytes &&
      meta.tokenizer_files != tokenizer->file_names()) {
    throw DataError(fmt::format(
        "'{}' names tokenizer files [{}] but a {} tokenizer is [{}]: meta.json does not "
        "describe the tokenizer beside it; prepare the dataset again",
        (dir / kMetaJsonName).string(), fmt::join(meta.tokenizer_files, ", "),
        tokenizer_kind_name(meta.tokenizer), fmt::join(tokenizer->file_names(), ", ")));
  }
  if (tokenizer->eot_id() != meta.eot_id) {
    const auto text = [](std::optional<std::int32_t> id) {
      return id ? std::to_string(*id) : std::string("null");
    };
    throw DataError(fmt::format(
        "'{}' says \"eot_id\" = {} but the {} tokenizer beside it has end-of-text id {}: the "
        "tokenizer files do not belong to this dataset; prepare it again",
        (dir / kMetaJsonName).string(), text(meta.eot_id), tokenizer_kind_name(meta.tokenizer),
        text(tokenizer->eot_id())));
  }
  if (tokenizer->vocab_size() != meta.vocab_size) {
    throw DataError(fmt::format(
        "the {} tokenizer in '{}' has {} ids but its meta.json says \"vocab_size\" = {}: the "
        "tokenizer files do not belong to this dataset; prepare it again",
        tokenizer_kind_name(meta.tokenizer), dir.string(), tokenizer->vocab_size(),
        meta.vocab_size));
  }
  return tokenizer;
}

}  // namespace meshtrain::data
