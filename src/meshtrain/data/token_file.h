// src/meshtrain/data/token_file.h
//
// A read-only memory map of a token file: raw little-endian uint16 ids, no header (nanoGPT's
// and prepare.h's format). Mapping instead of reading keeps one copy per node in the page
// cache however many ranks open the file. A mapped file must not be truncated while mapped
// (reads would fault); prepare.h replaces files by rename, which leaves an open mapping on
// the old inode intact. Uses: core/error.h, POSIX mmap.
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>

namespace meshtrain::data {

/// Width of the ids in a token file: uint16 while the vocabulary has ≤ 65,536 ids (GPT-2's
/// 50,257), uint32 above (Llama 3's 128,256). Names in meta.json: "uint16", "uint32".
enum class TokenDtype : std::uint8_t { u16, u32 };

// The file is little-endian and mapped as is; a big-endian host would need a byte swap.
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

/// Owns the mapping of one token file. Move-only; a moved-from or default-constructed
/// TokenFile is empty (size 0, no path).
class TokenFile {
 public:
  TokenFile() = default;

  /// Maps `path` read-only. With `vocab_size`, checks once that every id is < vocab_size
  /// (one pass; about a millisecond for Tiny Shakespeare), so a sampler never hands the model
  /// an id outside its embedding table.
  /// Errors: DataError naming `path` when it is missing, not a regular file, cannot be mapped,
  /// is empty, has an odd number of bytes, or holds an id ≥ vocab_size (the first such id and
  /// its index are named).
  explicit TokenFile(std::filesystem::path path, std::optional<std::int64_t> vocab_size = {});
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  /// The ids, [size()] uint16. Valid while this object (or the one it is moved into) lives:
  /// the mapping's address does not change on move.
  std::span<const std::uint16_t> tokens() const noexcept { return {data_, size_}; }
  /// Number of tokens (file bytes / 2).
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(size_); }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void unmap() noexcept;

  std::filesystem::path path_;
  const std::uint16_t* data_ = nullptr;
  std::size_t size_ = 0;  // tokens
};

}  // namespace meshtrain::data
