#include "meshtrain/data/token_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
std::int64_t first_out_of_vocab(std::span<const std::uint16_t> tokens, std::int64_t vocab_size) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) return static_cast<std::int64_t>(i);
  }
  return -1;
}

}  // namespace

TokenFile::TokenFile(std::filesystem::path path, std::optional<std::int64_t> vocab_size)
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
  if (bytes == 0 || bytes % 2 != 0) {
    ::close(fd);
    fail(path_, fmt::format("has {} bytes; a token file holds uint16 ids, so its size must be "
                            "even and non-zero (truncated or not a token file? prepare it again)",
                            bytes));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) fail(path_, fmt::format("cannot be mapped: {}", os_reason(map_err)));
  data_ = static_cast<const std::uint16_t*>(map);
  size_ = bytes / 2;

  if (vocab_size) {
    const std::int64_t bad = first_out_of_vocab(tokens(), *vocab_size);
    if (bad >= 0) {
      const std::uint16_t id = data_[bad];
      unmap();
      fail(path_, fmt::format("holds id {} at token {}, outside the vocabulary [0, {}); the file "
                              "and the vocabulary (meta.json) come from different datasets",
                              id, bad, *vocab_size));
    }
  }
}

TokenFile::~TokenFile() { unmap(); }

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {
  other.path_.clear();
}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    other.path_.clear();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void TokenFile::unmap() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::uint16_t*>(data_), 2 * size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace meshtrain::data
