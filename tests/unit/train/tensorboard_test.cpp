// TensorBoard event files (train/tensorboard.h) and their tags (train/reporting.h): the CRC32C
// test vector, TensorFlow's mask, the TFRecord framing byte by byte, a writer's file read back
// record by record (every CRC checked, data on disk after each flush), the directory check,
// and the metrics-key → tag mapping including MoE layers and the straggler list. The expected
// CRCs were computed with an independent bitwise CRC-32C (reflected polynomial 0x82F63B78) and
// the mask formula of tensorflow/tsl/lib/hash/crc32c.h; TensorBoard's own reader is in
// tests/e2e/tensorboard.sh.
#include "meshtrain/train/tensorboard.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/train/reporting.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::uint32_t le32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i)
    v |= static_cast<std::uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::uint64_t le64(const std::string& s, std::size_t at) {
  return le32(s, at) | (static_cast<std::uint64_t>(le32(s, at + 4)) << 32);
}

// Every record's payload; fails the test on a bad CRC or a torn record.
std::vector<std::string> read_records(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < data.size()) {
    EXPECT_LE(at + 12, data.size());
    const std::uint64_t n = le64(data, at);
    EXPECT_EQ(le32(data, at + 8), mask_crc32c(crc32c(bytes_of(data.substr(at, 8)))));
    EXPECT_LE(at + 16 + n, data.size());
    std::string payload = data.substr(at + 12, n);
    EXPECT_EQ(le32(data, at + 12 + n), mask_crc32c(crc32c(bytes_of(payload))));
    records.push_back(std::move(payload));
    at += 16 + n;
  }
  return records;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("meshtrain_tb_{}_{}", name, ::getpid());
  fs::remove_all(dir);
  return dir;
}

TEST(TensorBoard, Crc32cTestVector) {
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283U);  // the CRC-32C check value
  EXPECT_EQ(crc32c(bytes_of("abc")), 0x364B3FB7U);
}

TEST(TensorBoard, MaskRotatesRightBy15AndAddsTheDelta) {
  EXPECT_EQ(mask_crc32c(0), 0xA282EAD8U);
  EXPECT_EQ(mask_crc32c(0x80000000U), 0x00010000U + 0xA282EAD8U);
  EXPECT_EQ(mask_crc32c(0x00000001U), 0x00020000U + 0xA282EAD8U);  // bit 0 → bit 17
}

TEST(TensorBoard, RecordFraming) {
  const std::string r = tfrecord("abc");
  ASSERT_EQ(r.size(), 8U + 4U + 3U + 4U);
  EXPECT_EQ(le64(r, 0), 3U);
  EXPECT_EQ(le32(r, 8), 0x0E4999B0U);  // masked CRC32C of the 8 length bytes
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(le32(r, 15), 0x21F1576EU);            // masked CRC32C of "abc"
  EXPECT_EQ(le32(tfrecord(""), 8), 0x07980329U);  // an empty record's length CRC
}

TEST(TensorBoard, FileName) {
  EXPECT_EQ(tensorboard_file_name(1700000000, "node7"), "events.out.tfevents.1700000000.node7");
}

TEST(TensorBoard, WriterFlushesEachBatchAndStartsWithTheFileVersion) {
  const fs::path dir = fresh_dir("writer") / "sub";  // created by the writer
  {
    TensorBoardWriter w(dir);
    ASSERT_TRUE(fs::exists(w.path()));
    EXPECT_EQ(w.path().parent_path(), dir);
    EXPECT_TRUE(w.path().filename().string().starts_with("events.out.tfevents."));
    std::vector<std::string> records = read_records(w.path());
    ASSERT_EQ(records.size(), 1U);  // the file version is on disk before anything else
    EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);

    w.add_text("config", 0, "[model]\nn_layer = 4\n");
    const std::vector<TensorBoardScalar> scalars = {{"train/loss", 4.25}, {"val/loss", 4.5}};
    w.add_scalars(1, scalars);
    EXPECT_EQ(read_records(w.path()).size(), 1U);  // buffered until flush()
    w.flush();
    records = read_records(w.path());
    ASSERT_EQ(records.size(), 3U);
    EXPECT_NE(records[1].find("[model]\nn_layer = 4\n"), std::string::npos);
    EXPECT_NE(records[1].find("text"), std::string::npos);  // the plugin name
    EXPECT_NE(records[2].find("train/loss"), std::string::npos);
    float loss = 4.25F;  // simple_value: a little-endian float32 after its tag byte 0x15
    std::string expected("\x15", 1);
    expected.append(reinterpret_cast<const char*>(&loss), 4);
    EXPECT_NE(records[2].find(expected), std::string::npos);
    w.close();
    w.close();  // a second close does nothing
  }
  fs::remove_all(dir.parent_path());
}

TEST(TensorBoard, DirectoryCheck) {
  EXPECT_THROW(check_tensorboard_dir("/proc/meshtrain_tb", "--tensorboard"), ConfigError);
  try {
    check_tensorboard_dir("/proc/meshtrain_tb", "--tensorboard");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard = /proc/meshtrain_tb"), std::string::npos)
        << e.what();
  }
  const fs::path dir = fresh_dir("check");
  check_tensorboard_dir((dir / "a" / "b").string(), "--tensorboard");
  EXPECT_FALSE(fs::exists(dir)) << "the probe left what it created";
  check_tensorboard_dir("", "--tensorboard");  // not asked for: nothing to check
}

TEST(TensorBoard, TagsOfAMetricsLine) {
  const nlohmann::json line = nlohmann::json::parse(R"({
    "step": 7, "loss": 2.5, "lr": 0.001, "val_loss": 2.75, "skipped": true, "mfu": 0.1,
    "peak_bytes_grads": 1024, "dp_comm_bytes": 4096, "attention_s": 0.5, "eta_s": 12.0,
    "moe": [{"layer": 1, "imbalance": 1.5, "tokens_per_expert": [3, 5]}],
    "stragglers": [{"rank": 1, "phase": "backward"}, {"rank": 2, "phase": "forward"}]})");
  std::map<std::string, double> got;
  for (const TensorBoardScalar& s : tensorboard_scalars(line)) got[s.tag] = s.value;
  const std::map<std::string, double> expected = {{"train/loss", 2.5},
                                                  {"train/lr", 0.001},
                                                  {"val/loss", 2.75},
                                                  {"train/skipped", 1.0},
                                                  {"perf/mfu", 0.1},
                                                  {"memory/peak_bytes_grads", 1024},
                                                  {"comm/dp_comm_bytes", 4096},
                                                  {"comm/attention_s", 0.5},
                                                  {"progress/eta_s", 12.0},
                                                  {"moe/layer_1/imbalance", 1.5},
                                                  {"moe/layer_1/tokens_per_expert/0", 3},
                                                  {"moe/layer_1/tokens_per_expert/1", 5},
                                                  {"stragglers/count", 2}};
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace meshtrain
