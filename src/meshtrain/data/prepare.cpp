#include "meshtrain/data/prepare.h"

#include <fmt/format.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/data/char_vocab.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/core/staged_file.h"

namespace meshtrain::data {
namespace {

std::string read_text(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    throw DataError(
        fmt::format("text file '{}' does not exist; pass the path of a plain-text corpus, e.g. "
                    "data/tinyshakespeare.txt in the meshtrain repository",
                    path.string()));
  }
  if (!std::filesystem::is_regular_file(status)) {
    throw DataError(
        fmt::format("text file '{}' is not a regular file; pass a plain-text file", path.string()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError(fmt::format("cannot open text file '{}': {}; check its permissions",
                                path.string(), std::generic_category().message(errno)));
  }
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) {
    throw DataError(fmt::format("cannot read text file '{}': {}", path.string(),
                                std::generic_category().message(errno)));
  }
  if (text.size() < 2) {
    throw DataError(fmt::format(
        "text file '{}' has {} byte{}; the train/val split needs at least 2, so pass a real "
        "corpus",
        path.string(), text.size(), text.size() == 1 ? "" : "s"));
  }
  return text;
}

// Little-endian uint16, one per id, whatever the host byte order (ids are < 256 anyway).
std::vector<std::byte> to_uint16_le(std::span<const std::int32_t> ids) {
  std::vector<std::byte> bytes(2 * ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto id = static_cast<std::uint16_t>(ids[i]);
    bytes[2 * i] = static_cast<std::byte>(id & 0xff);
    bytes[2 * i + 1] = static_cast<std::byte>(id >> 8);
  }
  return bytes;
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

void create_out_dir(const std::filesystem::path& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec || !std::filesystem::is_directory(out_dir)) {
    throw DataError(
        fmt::format("cannot create output directory '{}': {}; choose a writable directory",
                    out_dir.string(), ec ? ec.message() : "a file of that name exists"));
  }
}

}  // namespace

PrepareResult prepare_char_dataset(const std::filesystem::path& text,
                                   const std::filesystem::path& out_dir) {
  const std::string corpus = read_text(text);
  const CharVocab vocab = CharVocab::from_text(corpus);
  const std::vector<std::int32_t> ids = vocab.encode(corpus);

  const auto n = static_cast<std::int64_t>(ids.size());
  // nanoGPT: data[:int(n*0.9)], a double product truncated toward zero.
  const auto n_train = static_cast<std::int64_t>(static_cast<double>(n) * 0.9);
  const std::span<const std::int32_t> all(ids);
  const std::span<const std::int32_t> train = all.first(static_cast<std::size_t>(n_train));
  const std::span<const std::int32_t> val = all.subspan(static_cast<std::size_t>(n_train));

  PrepareResult result;
  result.train_bin = out_dir / kTrainBinName;
  result.val_bin = out_dir / kValBinName;
  result.meta_json = out_dir / kMetaJsonName;
  result.vocab_size = vocab.size();
  result.train_tokens = n_train;
  result.val_tokens = n - n_train;

  const Metadata meta{.vocab = vocab,
                      .vocab_size = vocab.size(),
                      .source = text.string(),
                      .train_tokens = result.train_tokens,
                      .val_tokens = result.val_tokens};
  create_out_dir(out_dir);
  StagedFile train_file(result.train_bin, to_uint16_le(train));
  StagedFile val_file(result.val_bin, to_uint16_le(val));
  StagedFile meta_file(result.meta_json, as_bytes(metadata_to_json(meta)));

  // An old meta.json must not vouch for a mix of old and new .bin files if we stop midway.
  std::error_code ec;
  std::filesystem::remove(result.meta_json, ec);
  if (ec) {
    throw DataError(
        fmt::format("cannot replace '{}': {}", result.meta_json.string(), ec.message()));
  }
  train_file.commit();
  val_file.commit();
  meta_file.commit();
  sync_directory(out_dir);
  return result;
}

}  // namespace meshtrain::data
