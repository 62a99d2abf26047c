#include "meshtrain/data/token_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain::data {
namespace {

[[noreturn]] void fail(const std::filesystem::path& path, std::string_view problem) {
  throw DataError(fmt::format("token file '{}' {}", path.string(), problem));
}

std::string os_reason(int err) { return std::generic_category().message(err); }

// First index whose id is ≥ vocab_size, or -1.
template <typename T>
std::int64_t first_out_of_vocab(std::span<const T> ids, std::int64_t vocab_size) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (static_cast<std::int64_t>(ids[i]) >= vocab_size) return static_cast<std::int64_t>(i);
  }
  return -1;
}

std::int32_t header_int(const void* map, std::int64_t index) {
  std::int32_t value = 0;
  std::memcpy(&value, static_cast<const std::byte*>(map) + 4 * index, sizeof value);
  return value;
}

// A raw file that begins like an llm.c file was most likely given the wrong data.format.
std::string llmc_hint(const void* map, std::size_t bytes) {
  if (bytes < static_cast<std::size_t>(kLlmcHeaderBytes)) return "";
  const std::int32_t magic = header_int(map, 0);
  if (magic != kLlmcMagicGpt2 && magic != kLlmcMagicLlama3) return "";
  return fmt::format(" (it starts with llm.c's magic {}: set data.format = \"llmc\")", magic);
}

}  // namespace

std::string_view dtype_name(TokenDtype dtype) {
  return dtype == TokenDtype::u16 ? "uint16" : "uint32";
}

std::int64_t TokenSpan::at(std::int64_t index) const {
  MT_CHECK(index >= 0 && index < size(), "token {} outside [0, {})", index, size());
  const auto i = static_cast<std::size_t>(index);
  return dtype_ == TokenDtype::u16
             ? static_cast<const std::uint16_t*>(data_)[i]
             : static_cast<std::int64_t>(static_cast<const std::uint32_t*>(data_)[i]);
}

void TokenSpan::copy_to(std::int64_t first, std::span<std::int32_t> out) const {
  MT_CHECK(first >= 0 && first + static_cast<std::int64_t>(out.size()) <= size(),
           "tokens [{}, {}) outside [0, {})", first, first + static_cast<std::int64_t>(out.size()),
           size());
  const auto start = static_cast<std::size_t>(first);
  if (dtype_ == TokenDtype::u16) {
    const auto* ids = static_cast<const std::uint16_t*>(data_) + start;
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = ids[j];
  } else {
    const auto* ids = static_cast<const std::uint32_t*>(data_) + start;
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<std::int32_t>(ids[j]);
  }
}

TokenFile::TokenFile(std::filesystem::path path, const TokenFileOptions& options)
    : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail(path_, fmt::format("cannot be opened: {}; prepare the dataset first (meshtrain prepare)",
                            os_reason(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path_, "is not a regular file");
  }
  const auto bytes = static_cast<std::size_t>(st.st_size);
  const auto width = static_cast<std::size_t>(bytes_of(options.dtype));
  if (options.layout == TokenLayout::raw && (bytes == 0 || bytes % width != 0)) {
    ::close(fd);
    fail(path_, fmt::format("has {} bytes; a raw token file holds {} ids, so its size must be a "
                            "non-zero multiple of {} (truncated, or not a token file of that "
                            "width? prepare it again)",
                            bytes, dtype_name(options.dtype), width));
  }
  if (bytes == 0) {
    ::close(fd);
    fail(path_, "is empty, not an llm.c token file (1024-byte header, then the tokens)");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) fail(path_, fmt::format("cannot be mapped: {}", os_reason(map_err)));
  map_ = map;
  map_bytes_ = bytes;
  try {
    if (options.layout == TokenLayout::llmc) {
      check_llmc_header(bytes);
    } else {
      dtype_ = options.dtype;
      ids_ = static_cast<const std::byte*>(map_);
      size_ = bytes / width;
    }
    if (options.vocab_size) check_vocab(*options.vocab_size, options.layout);
  } catch (...) {
    unmap();
    throw;
  }
}

void TokenFile::check_llmc_header(std::size_t bytes) {
  const auto header_bytes = static_cast<std::size_t>(kLlmcHeaderBytes);
  if (bytes < header_bytes) {
    fail(path_, fmt::format("has {} bytes, fewer than llm.c's {}-byte header (256 int32): "
                            "truncated, or not an llm.c file (a raw file without a header is "
                            "data.format = \"nanogpt\")",
                            bytes, header_bytes));
  }
  const std::int32_t magic = header_int(map_, 0), version = header_int(map_, 1);
  if (magic != kLlmcMagicGpt2 && magic != kLlmcMagicLlama3) {
    fail(path_, fmt::format("has magic {} (header int32 [0]), not llm.c's {} (GPT-2, uint16 ids) "
                            "or {} (Llama 3, uint32 ids): not an llm.c token file (a raw file "
                            "without a header is data.format = \"nanogpt\")",
                            magic, kLlmcMagicGpt2, kLlmcMagicLlama3));
  }
  const bool gpt2 = magic == kLlmcMagicGpt2;
  const std::int32_t expected_version = gpt2 ? kLlmcVersionGpt2 : kLlmcVersionLlama3;
  if (version != expected_version) {
    fail(path_, fmt::format("has magic {} with version {} (header int32 [1]); llm.c writes "
                            "version {} with that magic (dev/data/data_common.py): rewrite the "
                            "file with llm.c's dev/data scripts",
                            magic, version, expected_version));
  }
  dtype_ = gpt2 ? TokenDtype::u16 : TokenDtype::u32;
  const std::int64_t count = header_int(map_, 2);
  const std::int64_t expected_bytes = kLlmcHeaderBytes + count * bytes_of(dtype_);
  if (count < 1 || expected_bytes != static_cast<std::int64_t>(bytes)) {
    fail(path_, fmt::format("has {} bytes, but its header (int32 [2]) says {} {} tokens, which "
                            "with the {}-byte header is {} bytes: truncated or not written whole; "
                            "write it again",
                            bytes, count, dtype_name(dtype_), kLlmcHeaderBytes, expected_bytes));
  }
  ids_ = static_cast<const std::byte*>(map_) + header_bytes;
  size_ = static_cast<std::size_t>(count);
}

void TokenFile::check_vocab(std::int64_t vocab_size, TokenLayout layout) {
  const std::int64_t bad = dtype_ == TokenDtype::u16 ? first_out_of_vocab(tokens(), vocab_size)
                                                     : first_out_of_vocab(tokens32(), vocab_size);
  if (bad < 0) return;
  const std::string hint = layout == TokenLayout::raw ? llmc_hint(map_, map_bytes_) : "";
  fail(path_, fmt::format("holds id {} at token {}, outside the vocabulary [0, {}){}; the file "
                          "and the vocabulary size (meta.json's vocab_size, or model.vocab_size "
                          "for nanoGPT and llm.c files) come from different datasets or "
                          "tokenizers",
                          ids().at(bad), bad, vocab_size, hint));
}

TokenSpan TokenFile::ids() const noexcept {
  if (dtype_ == TokenDtype::u16) {
    return TokenSpan(std::span(reinterpret_cast<const std::uint16_t*>(ids_), size_));
  }
  return TokenSpan(std::span(reinterpret_cast<const std::uint32_t*>(ids_), size_));
}

std::span<const std::uint16_t> TokenFile::tokens() const {
  MT_CHECK(dtype_ == TokenDtype::u16, "token file '{}' holds {} ids, not uint16", path_.string(),
           dtype_name(dtype_));
  return {reinterpret_cast<const std::uint16_t*>(ids_), size_};
}

std::span<const std::uint32_t> TokenFile::tokens32() const {
  MT_CHECK(dtype_ == TokenDtype::u32, "token file '{}' holds {} ids, not uint32", path_.string(),
           dtype_name(dtype_));
  return {reinterpret_cast<const std::uint32_t*>(ids_), size_};
}

TokenFile::~TokenFile() { unmap(); }

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      ids_(std::exchange(other.ids_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      dtype_(other.dtype_) {
  other.path_.clear();
}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    other.path_.clear();
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    ids_ = std::exchange(other.ids_, nullptr);
    size_ = std::exchange(other.size_, 0);
    dtype_ = other.dtype_;
  }
  return *this;
}

void TokenFile::unmap() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  ids_ = nullptr;
  size_ = 0;
}

}  // namespace meshtrain::data
