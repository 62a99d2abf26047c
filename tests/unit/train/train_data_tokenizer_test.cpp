// data.tokenizer (docs/data.md): nanoGPT's and llm.c's token files take their vocabulary from a
// tokenizer, whose files and a meta.json the final checkpoint then carries; beside meshtrain's
// own files the setting must name meta.json's tokenizer. Through load_run_metadata and
// TrainData, as the trainer calls them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/train/train_data.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

const fs::path kSource(MESHTRAIN_SOURCE_DIR);
const fs::path kGpt2 = kSource / "data/tokenizers/gpt2";

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("meshtrain_datatok_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// nanoGPT's raw uint16 ids (np.uint16 tofile, little-endian); token i = i·31 mod 50257, but
// `bad_id` at `bad_at`.
void write_nanogpt(const fs::path& path, std::int64_t n, std::int64_t bad_at = -1,
                   std::uint16_t bad_id = 0) {
  std::string bytes;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto id = i == bad_at ? bad_id : static_cast<std::uint16_t>((i * 31) % 50257);
    bytes.push_back(static_cast<char>(id & 0xff));
    bytes.push_back(static_cast<char>(id >> 8));
  }
  write_file(path, bytes);
}

Config data_config(const fs::path& dir, DataFormat format, std::string tokenizer,
                   std::int64_t vocab) {
  Config c;
  c.source = "test";
  c.model.block_size = 16;
  c.model.vocab_size = vocab;
  c.training.micro_batch = 4;
  c.data.dir = dir.string();
  c.data.format = format;
  c.data.tokenizer = std::move(tokenizer);
  return c;
}

template <typename E>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning " << needles.front();
  } catch (const E& e) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << needle << "'";
    }
  }
}

TEST(TrainDataTokenizer, NanoGptFilesTakeTheVocabularyFromTheTokenizerAndTheCheckpointCarriesIt) {
  const TempDir dir, ckpt;
  write_nanogpt(dir.path() / "train.bin", 3000);
  write_nanogpt(dir.path() / "val.bin", 500);
  Config c = data_config(dir.path(), DataFormat::nanogpt, "gpt2", 0);
  const TrainData data(c, load_run_metadata(c));
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(data.metadata().tokenizer, data::TokenizerKind::gpt2_bpe);
  EXPECT_EQ(data.metadata().eot_id, 50256);
  EXPECT_EQ(data.metadata().train_tokens, 3000);

  data.write_tokenizer(ckpt.path());
  const data::Metadata meta = data::load_metadata(ckpt.path() / "meta.json");
  EXPECT_EQ(meta.tokenizer, data::TokenizerKind::gpt2_bpe);
  EXPECT_EQ(meta.tokenizer_files, (std::vector<std::string>{"encoder.json", "vocab.bpe"}));
  EXPECT_EQ(meta.vocab_size, 50257);
  EXPECT_EQ(meta.eot_id, 50256);
  EXPECT_EQ(meta.train_tokens, 3000);
  EXPECT_EQ(meta.val_tokens, 500);
  EXPECT_DOUBLE_EQ(meta.val_fraction, 500.0 / 3500.0);
  EXPECT_EQ(read_file(ckpt.path() / "encoder.json"), read_file(kGpt2 / "encoder.json"));
  EXPECT_EQ(read_file(ckpt.path() / "vocab.bpe"), read_file(kGpt2 / "vocab.bpe"));
  const std::vector<std::int32_t> hello{15496, 995};  // tiktoken gpt2: "Hello world"
  EXPECT_EQ(data::load_tokenizer(meta, ckpt.path())->decode(hello), "Hello world");

  // Without data.tokenizer the vocabulary is model.vocab_size and nothing is written; a
  // meta.json of an earlier run in the directory is removed (it would describe other ids).
  Config plain = data_config(dir.path(), DataFormat::nanogpt, "", 50257);
  const TrainData untokenized(plain, load_run_metadata(plain));
  untokenized.write_tokenizer(ckpt.path());
  EXPECT_FALSE(fs::exists(ckpt.path() / "meta.json"));
  EXPECT_TRUE(fs::exists(ckpt.path() / "encoder.json"));  // only meta.json is removed
}

TEST(TrainDataTokenizer, APaddedVocabularyIsAllowedASmallerOneIsAConfigError) {
  const TempDir dir;
  write_nanogpt(dir.path() / "train.bin", 3000, 1234, 50300);  // ≥ GPT-2's 50257, < 50304
  write_nanogpt(dir.path() / "val.bin", 500);
  Config padded = data_config(dir.path(), DataFormat::nanogpt, "gpt2", 50304);
  RunMetadata run = load_run_metadata(padded);
  EXPECT_EQ(padded.model.vocab_size, 50304);  // nanoGPT's padding kept
  EXPECT_EQ(run.metadata.vocab_size, 50257);  // the tokenizer's, which the ids are checked against
  expect_error<DataError>([&] { TrainData t(padded, std::move(run)); },
                          {(dir.path() / "train.bin").string(), "id 50300 at token 1234"});

  Config small = data_config(dir.path(), DataFormat::llmc, "gpt2", 1000);
  expect_error<ConfigError>(
      [&] { load_run_metadata(small); },
      {"model.vocab_size = 1000", "must be ≥ the 50257 ids of data.tokenizer = \"gpt2\"",
       "set model.vocab_size = 0 to take 50257 from the tokenizer"});
}

TEST(TrainDataTokenizer, AMissingTokenizerIsADataErrorNamingTheFileAndTheSetting) {
  const TempDir dir;
  Config model =
      data_config(dir.path(), DataFormat::nanogpt, (dir.path() / "none.model").string(), 0);
  expect_error<DataError>([&] { load_run_metadata(model); },
                          {(dir.path() / "none.model").string(), "does not exist",
                           "data.tokenizer = \"" + (dir.path() / "none.model").string() + "\""});
  Config empty_dir = data_config(dir.path(), DataFormat::nanogpt, dir.path().string(), 0);
  expect_error<DataError>([&] { load_run_metadata(empty_dir); },
                          {dir.path().string(), "holds no encoder.json + vocab.bpe"});
}

TEST(TrainDataTokenizer, BesideMeshtrainFilesItMustBeMetaJsonsTokenizer) {
  const TempDir dir;
  write_file(dir.path() / "text.txt", read_file(kSource / "data/tinystories_sample.txt"));
  for (const std::string tokenizer : {"gpt2", "char"}) {
    data::prepare_dataset({.inputs = {dir.path() / "text.txt"},
                           .out_dir = dir.path() / tokenizer,
                           .tokenizer = tokenizer});
  }
  Config same = data_config(dir.path() / "gpt2", DataFormat::meshtrain, kGpt2.string(), 0);
  const RunMetadata run = load_run_metadata(same);
  EXPECT_EQ(same.model.vocab_size, 50257);
  EXPECT_EQ(run.tokenizer, nullptr);  // its own files are copied with meta.json

  Config on_char = data_config(dir.path() / "char", DataFormat::meshtrain, "gpt2", 0);
  expect_error<ConfigError>(
      [&] { load_run_metadata(on_char); },
      {"data.tokenizer = \"gpt2\"", "meta.json (char,",
       "it is a gpt2 tokenizer, the data's is char", "set data.tokenizer = \"\""});

  // GPT-2's files with the ids of "!" and "\"" swapped: same kind and size, other ids.
  const fs::path swapped = dir.path() / "swapped";
  fs::create_directories(swapped);
  std::string encoder = read_file(kGpt2 / "encoder.json");
  ASSERT_EQ(encoder.rfind("{\"!\": 0, \"\\\"\": 1,", 0), 0u);
  encoder.replace(0, 17, "{\"!\": 1, \"\\\"\": 0,");
  write_file(swapped / "encoder.json", encoder);
  fs::copy_file(kGpt2 / "vocab.bpe", swapped / "vocab.bpe");
  Config other = data_config(dir.path() / "gpt2", DataFormat::meshtrain, swapped.string(), 0);
  expect_error<ConfigError>([&] { load_run_metadata(other); },
                            {"id 0 is another text in it than in the data's"});
}

}  // namespace
}  // namespace meshtrain
