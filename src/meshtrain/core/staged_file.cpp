#include "meshtrain/core/staged_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

std::string os_reason(int err) { return std::generic_category().message(err); }

// Writes all of `bytes`; write() may write less than asked or be interrupted by a signal.
void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DataError(fmt::format("cannot write '{}': {}; check free disk space", path.string(),
                                  os_reason(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

StagedFile::StagedFile(std::filesystem::path target) : target_(std::move(target)) {
  // The temporary lives in the target's directory because rename() is atomic only within
  // one filesystem; the pid keeps two concurrent runs from writing the same temporary.
  const std::filesystem::path temporary =
      target_.parent_path() /
      fmt::format(".{}.tmp-{}", target_.filename().string(), static_cast<long>(::getpid()));
  fd_ = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw DataError(fmt::format("cannot create '{}': {}; check that the directory is writable",
                                temporary.string(), os_reason(errno)));
  }
  temporary_ = temporary;  // from here on the destructor removes it
}

StagedFile::StagedFile(std::filesystem::path target, std::span<const std::byte> bytes)
    : StagedFile(std::move(target)) {
  append(bytes);
  seal();
}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : target_(std::move(other.target_)),
      temporary_(std::exchange(other.temporary_, {})),
      fd_(std::exchange(other.fd_, -1)) {}

void StagedFile::append(std::span<const std::byte> bytes) {
  MT_CHECK(fd_ >= 0, "'{}' is not open for appending", target_.string());
  write_all(fd_, bytes, temporary_);
}

void StagedFile::seal() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw DataError(fmt::format("cannot fsync '{}': {}", temporary_.string(), os_reason(err)));
  }
  if (::close(fd) != 0) {
    throw DataError(fmt::format("cannot close '{}': {}", temporary_.string(), os_reason(errno)));
  }
}

void StagedFile::commit() {
  MT_CHECK(!temporary_.empty(), "'{}' was already committed or moved from", target_.string());
  seal();
  if (::rename(temporary_.c_str(), target_.c_str()) != 0) {
    throw DataError(fmt::format("cannot rename '{}' to '{}': {}", temporary_.string(),
                                target_.string(), os_reason(errno)));
  }
  temporary_.clear();
}

void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw DataError(fmt::format("cannot open directory '{}': {}", dir.string(), os_reason(errno)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) {
    throw DataError(fmt::format("cannot fsync directory '{}': {}", dir.string(), os_reason(err)));
  }
}

}  // namespace meshtrain
