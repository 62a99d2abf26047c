// src/meshtrain/core/staged_file.h
//
// Atomic file replacement (prepared datasets, checkpoints): write to a temporary name in the
// target's directory, fsync, and only then rename over the target, so a reader (or a rerun after a
// crash) sees either the old file or the complete new one, never half of it. Uses: core/error.h,
// POSIX.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace meshtrain {

/// Bytes written and fsynced under a temporary name beside `target`, waiting for commit().
/// Destroying an uncommitted StagedFile removes the temporary, so an exception between
/// staging and commit leaves the directory as it was. Move-only.
class StagedFile {
 public:
  /// Writes `bytes` to "<dir>/.<name>.tmp-<pid>" and fsyncs it. The directory must exist.
  /// Errors: DataError naming the temporary path and the OS reason (disk full, permissions).
  StagedFile(std::filesystem::path target, std::span<const std::byte> bytes);
  /// Streaming form: creates the temporary, empty and open; fill it with append().
  /// Errors: DataError naming the temporary path and the OS reason.
  explicit StagedFile(std::filesystem::path target);
  ~StagedFile();
  StagedFile(StagedFile&& other) noexcept;
  StagedFile& operator=(StagedFile&&) = delete;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  /// Appends `bytes` to the open temporary (streaming form, before commit()).
  /// Errors: DataError naming the temporary path (disk full, permissions).
  void append(std::span<const std::byte> bytes);

  /// fsyncs (when still open, as after append()), closes, then renames the temporary over
  /// the target (atomic within one filesystem). Errors: DataError naming both paths.
  void commit();

  const std::filesystem::path& target() const noexcept { return target_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temporary_;  // empty once committed or moved from
  int fd_ = -1;                      // the open temporary (streaming form), else -1

  void seal();  // fsync + close fd_
};

/// fsyncs a directory so that renames inside it survive a power loss. Filesystems that
/// cannot fsync a directory (EINVAL) are accepted silently: the data itself is synced.
/// Errors: DataError naming the directory.
void sync_directory(const std::filesystem::path& dir);

}  // namespace meshtrain
