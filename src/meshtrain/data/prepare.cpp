#include "meshtrain/data/prepare.h"

#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/data/char_vocab.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain::data {
namespace {

namespace fs = std::filesystem;

std::ifstream open_input(const fs::path& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    throw DataError(
        fmt::format("text file '{}' does not exist; pass the path of a plain-text corpus, e.g. "
                    "data/tinyshakespeare.txt in the meshtrain repository",
                    path.string()));
  }
  if (!fs::is_regular_file(status)) {
    throw DataError(
        fmt::format("text file '{}' is not a regular file; pass a plain-text file", path.string()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError(fmt::format("cannot open text file '{}': {}; check its permissions",
                                path.string(), std::generic_category().message(errno)));
  }
  return in;
}

// Reads the next chunk of `in` into `buffer` (resized to what was read; empty at the end).
void read_chunk(std::ifstream& in, const fs::path& path, std::string& buffer, std::size_t size) {
  buffer.resize(size);
  in.read(buffer.data(), static_cast<std::streamsize>(size));
  if (in.bad()) {
    throw DataError(fmt::format("cannot read text file '{}': {}", path.string(),
                                std::generic_category().message(errno)));
  }
  buffer.resize(static_cast<std::size_t>(in.gcount()));
}

bool is_unit_start(char c) { return (static_cast<unsigned char>(c) & 0xc0) != 0x80; }

// Throttled "bytes done, rate, ETA" lines on stderr: at most one a second, none for a pass
// that ends within its first second.
class Progress {
 public:
  Progress(bool enabled, std::string_view label, std::int64_t total)
      : enabled_(enabled), label_(label), total_(total), start_(Clock::now()), last_(start_) {}

  void update(std::int64_t done) {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    if (now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = static_cast<double>(done) / seconds;
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
    fmt::print(stderr, "prepare: {} {:.1f} / {:.1f} MiB ({:.0f} %), {:.1f} MiB/s, ETA {:.0f} s\n",
               label_, static_cast<double>(done) / 1048576.0,
               static_cast<double>(total_) / 1048576.0,
               total_ > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total_) : 100.0,
               rate / 1048576.0, eta);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  std::string label_;
  std::int64_t total_;
  Clock::time_point start_;
  Clock::time_point last_;
};

// What pass 1 learns about the text.
struct Scan {
  std::int64_t bytes = 0;
  std::int64_t chars = 0;  // UTF-8 lead bytes (a stray continuation byte joins the one before)
  std::array<bool, 256> present{};
};

Scan scan_inputs(const PrepareOptions& options) {
  Scan scan;
  std::int64_t total = 0;
  for (const fs::path& input : options.inputs) {
    open_input(input);
    std::error_code ec;
    total += static_cast<std::int64_t>(fs::file_size(input, ec));
  }
  Progress progress(options.progress, "scanning", total);
  std::string chunk;
  for (const fs::path& input : options.inputs) {
    std::ifstream in = open_input(input);
    for (read_chunk(in, input, chunk, options.chunk_bytes); !chunk.empty();
         read_chunk(in, input, chunk, options.chunk_bytes)) {
      for (const char c : chunk) {
        scan.present[static_cast<unsigned char>(c)] = true;
        scan.chars += is_unit_start(c) ? 1 : 0;
      }
      scan.bytes += static_cast<std::int64_t>(chunk.size());
      progress.update(scan.bytes);
    }
  }
  return scan;
}

// Little-endian ids appended to a staged token file.
class TokenSink {
 public:
  TokenSink(fs::path target, TokenDtype dtype) : file_(std::move(target)), dtype_(dtype) {}

  void write(std::span<const std::int32_t> ids) {
    const std::size_t width = dtype_ == TokenDtype::u16 ? 2 : 4;
    bytes_.resize(ids.size() * width);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto id = static_cast<std::uint32_t>(ids[i]);
      for (std::size_t k = 0; k < width; ++k) {
        bytes_[i * width + k] = static_cast<std::byte>((id >> (8 * k)) & 0xff);
      }
    }
    file_.append(bytes_);
    count_ += static_cast<std::int64_t>(ids.size());
  }

  std::int64_t count() const noexcept { return count_; }
  StagedFile& file() noexcept { return file_; }

 private:
  StagedFile file_;
  TokenDtype dtype_;
  std::vector<std::byte> bytes_;
  std::int64_t count_ = 0;
};

// One side (train or val): raw text in, documents found, encoded chunk by chunk, ids out.
class SplitEncoder {
 public:
  SplitEncoder(const Tokenizer& tokenizer, TokenSink& sink, const PrepareOptions& options)
      : tokenizer_(tokenizer),
        sink_(sink),
        separator_(options.document_separator),
        chunk_bytes_(options.chunk_bytes) {}

  // Raw bytes of the current file that belong to this side.
  void feed(std::string_view raw) {
    if (separator_.empty()) return add_content(raw);
    pending_ += raw;
    std::size_t at = 0;
    for (std::size_t hit = pending_.find(separator_); hit != std::string::npos;
         hit = pending_.find(separator_, at)) {
      add_content(std::string_view(pending_).substr(at, hit - at));
      end_document();
      at = hit + separator_.size();
    }
    // Keep what could be the start of a separator that the next chunk completes.
    const std::size_t keep = std::min(pending_.size() - at, separator_.size() - 1);
    add_content(std::string_view(pending_).substr(at, pending_.size() - at - keep));
    pending_.erase(0, pending_.size() - keep);
  }

  // The end of a file, or of this side's part of it.
  void end_file() {
    add_content(pending_);
    pending_.clear();
    end_document();
  }

 private:
  void add_content(std::string_view text) {
    if (text.empty()) return;
    if (!document_open_) {
      // Between documents only: no eot before the first or after the last one.
      if (any_document_ && tokenizer_.eot_id())
        write(std::vector<std::int32_t>{*tokenizer_.eot_id()});
      document_open_ = any_document_ = true;
    }
    text_ += text;
    if (text_.size() < chunk_bytes_) return;
    ids_.clear();
    const std::size_t consumed = tokenizer_.encode_prefix(text_, ids_);
    write(ids_);
    text_.erase(0, consumed);
  }

  void end_document() {
    if (!document_open_) return;
    ids_.clear();
    tokenizer_.encode(text_, ids_);
    write(ids_);
    text_.clear();
    document_open_ = false;
  }

  void write(std::span<const std::int32_t> ids) { sink_.write(ids); }

  const Tokenizer& tokenizer_;
  TokenSink& sink_;
  std::string separator_;
  std::size_t chunk_bytes_;
  std::string pending_;  // raw bytes not yet searched for the whole separator
  std::string text_;     // the open document's text not yet encoded
  std::vector<std::int32_t> ids_;
  bool document_open_ = false;
  bool any_document_ = false;
};

void create_out_dir(const fs::path& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir)) {
    throw DataError(
        fmt::format("cannot create output directory '{}': {}; choose a writable directory",
                    out_dir.string(), ec ? ec.message() : "a file of that name exists"));
  }
}

void check_options(const PrepareOptions& options) {
  std::vector<ConfigIssue> issues;
  if (!(options.val_fraction > 0.0 && options.val_fraction < 1.0)) {
    issues.push_back({"--val-fraction", fmt::format("{}", options.val_fraction),
                      "must lie in (0, 1): both train.bin and val.bin need tokens",
                      "use e.g. 0.1 (nanoGPT's split)"});
  }
  if (options.inputs.empty()) {
    issues.push_back(
        {"text", "(none)", "needs at least one text file", "pass e.g. data/tinyshakespeare.txt"});
  }
  if (options.chunk_bytes == 0) issues.push_back({"chunk_bytes", "0", "must be > 0", "use 1 MiB"});
  if (!issues.empty()) throw ConfigError("the command line", std::move(issues));
}

std::string describe_inputs(const PrepareOptions& options) {
  if (options.inputs.size() == 1) return fmt::format("text file '{}'", options.inputs[0].string());
  return fmt::format("the {} text files", options.inputs.size());
}

// Pass 2: every byte of the inputs into train (before unit `n_train`) or val.
void encode_inputs(const PrepareOptions& options, const Tokenizer& tokenizer, bool byte_units,
                   std::int64_t n_train, std::int64_t total_bytes, TokenSink& train,
                   TokenSink& val) {
  SplitEncoder sides[2] = {{tokenizer, train, options}, {tokenizer, val, options}};
  int side = 0;
  std::int64_t units = 0;
  std::int64_t done = 0;
  Progress progress(options.progress, "encoding", total_bytes);
  std::string chunk;
  for (const fs::path& input : options.inputs) {
    std::ifstream in = open_input(input);
    for (read_chunk(in, input, chunk, options.chunk_bytes); !chunk.empty();
         read_chunk(in, input, chunk, options.chunk_bytes)) {
      std::size_t cut = chunk.size();
      if (side == 0) {
        for (std::size_t i = 0; i < chunk.size(); ++i) {
          if (!byte_units && !is_unit_start(chunk[i])) continue;
          if (units == n_train) {
            cut = i;
            break;
          }
          ++units;
        }
      }
      sides[side].feed(std::string_view(chunk).substr(0, cut));
      if (cut < chunk.size()) {
        sides[0].end_file();
        side = 1;
        sides[1].feed(std::string_view(chunk).substr(cut));
      }
      done += static_cast<std::int64_t>(chunk.size());
      progress.update(done);
    }
    sides[side].end_file();
  }
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& options) {
  check_options(options);
  // A bad tokenizer file fails before a long scan; "char" needs the scan first.
  std::unique_ptr<Tokenizer> tokenizer;
  if (options.tokenizer != "char") tokenizer = open_tokenizer(options.tokenizer);
  const Scan scan = scan_inputs(options);
  if (!tokenizer) {
    std::vector<std::uint8_t> chars;
    for (int b = 0; b < 256; ++b) {
      if (scan.present[static_cast<std::size_t>(b)]) chars.push_back(static_cast<std::uint8_t>(b));
    }
    if (chars.empty()) {
      throw DataError(fmt::format("{} {} empty; pass a real corpus", describe_inputs(options),
                                  options.inputs.size() == 1 ? "is" : "are all"));
    }
    const CharVocab corpus = CharVocab::from_chars(std::move(chars));
    tokenizer = open_tokenizer("char", &corpus);
  }
  const bool byte_units = tokenizer->kind() == TokenizerKind::char_bytes;
  const std::int64_t n = byte_units ? scan.bytes : scan.chars;
  // nanoGPT: data[:int(n*0.9)], a double product truncated toward zero.
  const auto n_train =
      static_cast<std::int64_t>(static_cast<double>(n) * (1.0 - options.val_fraction));
  if (n_train < 1 || n_train >= n) {
    throw DataError(fmt::format(
        "{} has {} {}; with --val-fraction {} the train/val split leaves a side empty, so pass "
        "more text or another fraction",
        describe_inputs(options), n, byte_units ? "bytes" : "characters", options.val_fraction));
  }

  PrepareResult result;
  result.train_bin = options.out_dir / kTrainBinName;
  result.val_bin = options.out_dir / kValBinName;
  result.meta_json = options.out_dir / kMetaJsonName;
  result.vocab_size = tokenizer->vocab_size();
  result.token_dtype = result.vocab_size <= 65536 ? TokenDtype::u16 : TokenDtype::u32;
  result.text_bytes = scan.bytes;

  create_out_dir(options.out_dir);
  TokenSink train(result.train_bin, result.token_dtype);
  TokenSink val(result.val_bin, result.token_dtype);
  encode_inputs(options, *tokenizer, byte_units, n_train, scan.bytes, train, val);
  result.train_tokens = train.count();
  result.val_tokens = val.count();

  Metadata meta;
  meta.tokenizer = tokenizer->kind();
  if (const auto* chars = dynamic_cast<const CharTokenizer*>(tokenizer.get()))
    meta.vocab = chars->vocab();
  meta.tokenizer_files = tokenizer->file_names();
  meta.vocab_size = result.vocab_size;
  meta.token_dtype = result.token_dtype;
  meta.eot_id = tokenizer->eot_id();
  for (const fs::path& input : options.inputs) meta.sources.push_back(input.string());
  meta.document_separator = options.document_separator;
  meta.val_fraction = options.val_fraction;
  meta.train_tokens = result.train_tokens;
  meta.val_tokens = result.val_tokens;
  const std::string meta_text = metadata_to_json(meta);
  StagedFile meta_file(result.meta_json, std::as_bytes(std::span<const char>(meta_text)));

  // An old meta.json must not vouch for a mix of old and new files if we stop midway.
  std::error_code ec;
  fs::remove(result.meta_json, ec);
  if (ec) {
    throw DataError(
        fmt::format("cannot replace '{}': {}", result.meta_json.string(), ec.message()));
  }
  tokenizer->save_files(options.out_dir);
  train.file().commit();
  val.file().commit();
  meta_file.commit();
  sync_directory(options.out_dir);
  return result;
}

PrepareResult prepare_char_dataset(const fs::path& text, const fs::path& out_dir) {
  PrepareOptions options;
  options.inputs = {text};
  options.out_dir = out_dir;
  return prepare_dataset(options);
}

}  // namespace meshtrain::data
