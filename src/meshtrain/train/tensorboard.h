// src/meshtrain/train/tensorboard.h — a TensorBoard event file: scalars and text, written
// as TensorBoard's readers (EventAccumulator, `tensorboard --logdir`) expect.
//
// The file is a sequence of TFRecords (TensorFlow's tensorflow/core/lib/io/record_writer.h):
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | length bytes |
//   uint32 masked CRC32C of the bytes,
// each record one serialised Event (train/tensorboard_event.proto, TensorBoard's field numbers),
// the first one file_version "brain.Event:2". The protobuf dependency stays inside
// tensorboard.cpp: this header names no generated type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

/// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected, init and final XOR 0xFFFFFFFF), as
/// Boost.CRC computes it: "123456789" → 0xE3069283.
std::uint32_t crc32c(std::span<const std::byte> bytes);
/// TensorFlow's masked CRC (tensorflow/tsl/lib/hash/crc32c.h, Mask): the CRC rotated right by
/// 15 bits plus 0xa282ead8, so that a CRC over data holding CRCs is not degenerate.
std::uint32_t mask_crc32c(std::uint32_t crc);
/// One TFRecord holding `data` (the framing above).
std::string tfrecord(std::string_view data);

/// One scalar of a step: a tag ("train/loss") and its value (stored as float32, as
/// TensorBoard's scalars are).
struct TensorBoardScalar {
  std::string tag;
  double value = 0.0;
};

/// Appends events to <dir>/events.out.tfevents.<unix seconds>.<hostname> (TensorFlow's name;
/// TensorBoard reads every file of a directory whose name contains "tfevents"). Records are
/// buffered until flush(), which hands them to the kernel in one write, so a run killed after
/// a step's flush keeps that step; close() also fsyncs. Not thread-safe; one writer per file.
class TensorBoardWriter {
 public:
  /// Creates `dir` if missing and the event file, and writes the file_version event.
  /// Throws DataError naming the path when it cannot.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  /// Closes the file (fsync); errors are not reported here — call close() to see them.
  ~TensorBoardWriter();

  /// One Summary event at `step` holding every scalar (simple_value, float32).
  void add_scalars(std::int64_t step, std::span<const TensorBoardScalar> scalars);
  /// One Summary event at `step` with `text` under `tag` for the text plugin (a rank-0
  /// DT_STRING tensor, plugin "text").
  void add_text(std::string_view tag, std::int64_t step, std::string_view text);
  /// Writes the buffered records. Throws DataError naming the file on a failed write.
  void flush();
  /// flush(), fsync and close; later calls do nothing. Throws DataError naming the file.
  void close();

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void append_event(const std::string& serialized_event);

  std::filesystem::path path_;
  int fd_ = -1;
  std::string pending_;  // framed records not yet written
};

/// The event file name TensorFlow's writers use: events.out.tfevents.<unix_seconds>.<host>.
std::string tensorboard_file_name(std::int64_t unix_seconds, std::string_view host);

/// Throws ConfigError naming `option` when `dir` is neither a writable directory nor one
/// that can be created (it is created when missing; a probe file is written and removed).
void check_tensorboard_dir(const std::string& dir, const std::string& option);

}  // namespace meshtrain
