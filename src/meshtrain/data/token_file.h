// src/meshtrain/data/token_file.h
//
// A read-only memory map of a token file, in one of the layouts people already have
// (docs/data.md, "Token files"):
//   raw   no header; little-endian ids of one width from byte 0. meshtrain's own files (the
//         width in meta.json's "token_dtype") and nanoGPT's train.bin / val.bin (uint16;
//         nanoGPT's data/*/prepare.py writes np.uint16 arrays with tofile()).
//   llmc  llm.c's files (dev/data/data_common.py, write_datafile): a header of 256
//         little-endian int32 (1024 bytes) — [0] magic, [1] version, [2] number of tokens, the
//         rest zero — then the ids. Magic 20240520 with version 1: uint16 ids (GPT-2); magic
//         20240801 with version 7: uint32 ids (Llama 3).
// Mapping instead of reading keeps one copy per node in the page cache however many ranks
// open the file. A mapped file must not be truncated while mapped (reads would fault);
// prepare.h replaces files by rename, which leaves an open mapping on the old inode intact.
// Uses: core/error.h, POSIX mmap.
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>

namespace meshtrain::data {

/// Width of the ids in a token file: uint16 while the vocabulary has ≤ 65,536 ids (GPT-2's
/// 50,257), uint32 above (Llama 3's 128,256). Names in meta.json: "uint16", "uint32".
enum class TokenDtype : std::uint8_t { u16, u32 };

/// Bytes of one id: 2 or 4.
constexpr std::int64_t bytes_of(TokenDtype dtype) { return dtype == TokenDtype::u16 ? 2 : 4; }
/// "uint16" or "uint32" (numpy's and meta.json's names).
std::string_view dtype_name(TokenDtype dtype);

/// How a token file lays out its ids (see the top of this file).
enum class TokenLayout : std::uint8_t { raw, llmc };

/// llm.c's header (dev/data/data_common.py, HEADERS_INFO and write_datafile).
inline constexpr std::int64_t kLlmcHeaderInts = 256;
inline constexpr std::int64_t kLlmcHeaderBytes = 4 * kLlmcHeaderInts;
inline constexpr std::int32_t kLlmcMagicGpt2 = 20240520;  // with version 1: uint16 ids
inline constexpr std::int32_t kLlmcVersionGpt2 = 1;
inline constexpr std::int32_t kLlmcMagicLlama3 = 20240801;  // with version 7: uint32 ids
inline constexpr std::int32_t kLlmcVersionLlama3 = 7;

// The file is little-endian and mapped as is; a big-endian host would need a byte swap.
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

/// A non-owning view of a file's ids, of either width. Copyable; valid while the mapping it
/// came from lives.
class TokenSpan {
 public:
  TokenSpan() = default;
  explicit TokenSpan(std::span<const std::uint16_t> ids) noexcept
      : data_(ids.data()), size_(ids.size()), dtype_(TokenDtype::u16) {}
  explicit TokenSpan(std::span<const std::uint32_t> ids) noexcept
      : data_(ids.data()), size_(ids.size()), dtype_(TokenDtype::u32) {}

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(size_); }
  TokenDtype dtype() const noexcept { return dtype_; }
  /// Id at `index` in [0, size()) (MT_CHECK).
  std::int64_t at(std::int64_t index) const;
  /// out[j] = id first + j for j < out.size(); requires first ≥ 0 and first + out.size() ≤
  /// size() (MT_CHECK). The ids must be < 2^31, which holds whenever the file was checked
  /// against a vocabulary of at most 2^31 ids.
  void copy_to(std::int64_t first, std::span<std::int32_t> out) const;

 private:
  const void* data_ = nullptr;
  std::size_t size_ = 0;
  TokenDtype dtype_ = TokenDtype::u16;
};

/// How to read one token file.
struct TokenFileOptions {
  TokenLayout layout = TokenLayout::raw;
  TokenDtype dtype = TokenDtype::u16;  // raw only: an llm.c header names its own width
  /// When set, every id is checked once to be < vocab_size (one pass over the file, about a
  /// millisecond for Tiny Shakespeare; a sequential read of the mapping, so for a large
  /// corpus about the time the page cache needs to read it), so a sampler never hands the
  /// model an id outside its embedding table.
  std::optional<std::int64_t> vocab_size;
};

/// Owns the mapping of one token file. Move-only; a moved-from or default-constructed
/// TokenFile is empty (size 0, no path).
class TokenFile {
 public:
  TokenFile() = default;

  /// Maps `path` read-only as options.layout says.
  /// Errors: DataError naming `path` when it is missing, not a regular file, cannot be mapped,
  /// holds no token, has a size that is not a whole number of ids; for llm.c, when it is
  /// shorter than the header, has another magic, a version that does not go with the magic, or
  /// a token count (header [2]) that disagrees with the file's size; and when an id is
  /// ≥ options.vocab_size (the first such id and its index are named).
  TokenFile(std::filesystem::path path, const TokenFileOptions& options);
  /// A raw uint16 file (nanoGPT's, or meshtrain's for a vocabulary of ≤ 65,536 ids).
  explicit TokenFile(std::filesystem::path path, std::optional<std::int64_t> vocab_size = {})
      : TokenFile(std::move(path), TokenFileOptions{.vocab_size = vocab_size}) {}
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  /// The ids, either width. Valid while this object (or the one it is moved into) lives: the
  /// mapping's address does not change on move.
  TokenSpan ids() const noexcept;
  /// The ids of a uint16 file, [size()] (MT_CHECK dtype() == u16).
  std::span<const std::uint16_t> tokens() const;
  /// The ids of a uint32 file, [size()] (MT_CHECK dtype() == u32).
  std::span<const std::uint32_t> tokens32() const;
  /// Number of tokens (without an llm.c header).
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(size_); }
  TokenDtype dtype() const noexcept { return dtype_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void unmap() noexcept;
  void check_llmc_header(std::size_t bytes);
  void check_vocab(std::int64_t vocab_size, TokenLayout layout);

  std::filesystem::path path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const std::byte* ids_ = nullptr;  // first id: map_, or map_ + the llm.c header
  std::size_t size_ = 0;            // tokens
  TokenDtype dtype_ = TokenDtype::u16;
};

}  // namespace meshtrain::data
