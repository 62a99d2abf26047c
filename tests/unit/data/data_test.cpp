// Tests of data/: the character vocabulary and dataset preparation against nanoGPT's
// shakespeare_char numbers, the memory-mapped token file and its error reports, and the
// global-batch sampler (DESIGN invariant 2: a batch depends only on (seed, step), and the
// union over dp ranks and accumulation steps is the same batch whatever the layout).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "support/temp_files.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/data/char_vocab.h"
#include "meshtrain/data/metadata.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/data/token_file.h"

namespace meshtrain::data {
namespace {

namespace fs = std::filesystem;
using test::read_file;
using test::TempDir;
using test::write_file;

// Little-endian uint16 token file, the format prepare writes.
void write_tokens(const fs::path& path, const std::vector<std::uint16_t>& tokens) {
  std::string bytes;
  for (const std::uint16_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  write_file(path, bytes);
}

// llm.c's dev/test/test_dataloader.c idea: token i holds i % 60000, so a window's contents
// prove which offset it came from.
constexpr std::int64_t kSyntheticTokens = 70000;
std::uint16_t synthetic_token(std::int64_t i) { return static_cast<std::uint16_t>(i % 60000); }
void write_synthetic(const fs::path& path, std::int64_t n = kSyntheticTokens) {
  std::vector<std::uint16_t> tokens(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) tokens[static_cast<std::size_t>(i)] = synthetic_token(i);
  write_tokens(path, tokens);
}

// Runs `fn`, expecting a DataError whose message contains `needle` (usually a path).
void expect_data_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected a DataError mentioning '" << needle << "'";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  }
}

std::vector<std::int32_t> widen(std::span<const std::uint16_t> tokens) {
  return {tokens.begin(), tokens.end()};
}

fs::path tiny_shakespeare() { return fs::path(MESHTRAIN_SOURCE_DIR) / "data/tinyshakespeare.txt"; }

// ---- CharVocab ------------------------------------------------------------------------

TEST(CharVocab, IdsAreSortedDistinctBytesAndRoundTrip) {
  const CharVocab vocab = CharVocab::from_text("hello world");
  ASSERT_EQ(vocab.size(), 8);
  EXPECT_EQ(vocab.decode(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7}), " dehlorw");
  const std::vector<std::int32_t> ids = vocab.encode("world hello");
  EXPECT_EQ(ids, (std::vector<std::int32_t>{7, 5, 6, 4, 1, 0, 3, 2, 4, 4, 5}));
  EXPECT_EQ(vocab.decode(ids), "world hello");
  // Every byte value survives, including NUL and bytes ≥ 0x80 (UTF-8 pieces).
  std::string all_bytes;
  for (int b = 255; b >= 0; --b) all_bytes.push_back(static_cast<char>(b));
  const CharVocab full = CharVocab::from_text(all_bytes);
  EXPECT_EQ(full.size(), 256);
  EXPECT_EQ(full.decode(full.encode(all_bytes)), all_bytes);
}

TEST(CharVocab, EncodeNamesTheUnknownCharacter) {
  const CharVocab vocab = CharVocab::from_text("abc");
  expect_data_error([&] { vocab.encode("abz"); }, "'z'");
  expect_data_error([&] { vocab.encode("abz"); }, "position 2");
  expect_data_error([&] { vocab.encode("a\xc3"); }, "0xc3");
}

TEST(CharVocab, DecodeRejectsOutOfRangeIds) {
  const CharVocab vocab = CharVocab::from_text("abc");
  expect_data_error([&] { vocab.decode(std::vector<std::int32_t>{0, 3}); }, "token id 3");
  expect_data_error([&] { vocab.decode(std::vector<std::int32_t>{-1}); }, "token id -1");
}

TEST(CharVocab, FromCharsRejectsListsFromTextCouldNotGive) {
  EXPECT_EQ(CharVocab::from_chars({10, 32, 97}).decode(std::vector<std::int32_t>{2, 1, 0}), "a \n");
  EXPECT_THROW(CharVocab::from_chars({}), DataError);
  EXPECT_THROW(CharVocab::from_chars({32, 10}), DataError);
  EXPECT_THROW(CharVocab::from_chars({32, 32}), DataError);
}

// ---- prepare_char_dataset -------------------------------------------------------------

TEST(PrepareCharDataset, TinyShakespeareMatchesNanoGpt) {
  const TempDir dir;
  const fs::path out = dir.path() / "shakespeare_char";  // does not exist yet
  const PrepareResult result = prepare_char_dataset(tiny_shakespeare(), out);

  // The numbers nanoGPT's data/shakespeare_char/prepare.py prints.
  EXPECT_EQ(result.vocab_size, 65);
  EXPECT_EQ(result.train_tokens, 1003854);
  EXPECT_EQ(result.val_tokens, 111540);
  EXPECT_EQ(result.train_bin, out / "train.bin");
  EXPECT_EQ(result.val_bin, out / "val.bin");
  EXPECT_EQ(result.meta_json, out / "meta.json");
  EXPECT_EQ(fs::file_size(result.train_bin), 2u * 1003854u);
  EXPECT_EQ(fs::file_size(result.val_bin), 2u * 111540u);

  const Metadata meta = load_metadata(result.meta_json);
  EXPECT_EQ(meta.vocab.decode(std::vector<std::int32_t>{0, 1, 2, 12, 13, 38, 39, 64}), "\n !?AZaz");
  EXPECT_EQ(meta.vocab.encode("hii there"),
            (std::vector<std::int32_t>{46, 47, 47, 1, 58, 46, 43, 56, 43}));  // nanoGPT's demo
  EXPECT_EQ(meta.train_tokens, 1003854);
  EXPECT_EQ(meta.val_tokens, 111540);
  EXPECT_EQ(meta.sources, std::vector<std::string>{tiny_shakespeare().string()});

  // "First Citizen": 'F' is id 18, stored little-endian.
  const std::string train_bytes = read_file(result.train_bin);
  EXPECT_EQ(train_bytes[0], 18);
  EXPECT_EQ(train_bytes[1], 0);

  const TokenFile train(result.train_bin, meta.vocab.size());
  const TokenFile val(result.val_bin, meta.vocab.size());
  EXPECT_EQ(meta.vocab.decode(widen(train.tokens())) + meta.vocab.decode(widen(val.tokens())),
            read_file(tiny_shakespeare()));

  // Exactly the three files: no temporaries left behind.
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(out)) names.insert(entry.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"meta.json", "train.bin", "val.bin"}));
}

TEST(PrepareCharDataset, RerunReplacesTheFiles) {
  const TempDir dir;
  write_file(dir.path() / "a.txt", "abcdefghij");            // 10 bytes: 9 train, 1 val
  write_file(dir.path() / "b.txt", "zzzzzzzzzzzzzzzzzzzy");  // 20 bytes: 18 train, 2 val
  const fs::path out = dir.path() / "out";
  EXPECT_EQ(prepare_char_dataset(dir.path() / "a.txt", out).train_tokens, 9);
  const PrepareResult second = prepare_char_dataset(dir.path() / "b.txt", out);
  EXPECT_EQ(second.vocab_size, 2);
  EXPECT_EQ(second.train_tokens, 18);
  EXPECT_EQ(second.val_tokens, 2);
  const Metadata meta = load_metadata(second.meta_json);
  EXPECT_EQ(meta.vocab.decode(widen(TokenFile(second.val_bin).tokens())), "zy");
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 3);
}

TEST(PrepareCharDataset, BadInputsThrowNamingThePath) {
  const TempDir dir;
  const fs::path missing = dir.path() / "no_such.txt";
  expect_data_error([&] { prepare_char_dataset(missing, dir.path() / "out"); }, missing.string());
  EXPECT_FALSE(fs::exists(dir.path() / "out"));

  const fs::path empty = dir.path() / "empty.txt";
  write_file(empty, "");
  expect_data_error([&] { prepare_char_dataset(empty, dir.path() / "out"); }, empty.string());

  expect_data_error([&] { prepare_char_dataset(dir.path(), dir.path() / "out"); },
                    dir.path().string());

  // out_dir under a regular file cannot be created.
  const fs::path text = dir.path() / "text.txt";
  write_file(text, "some text");
  const fs::path blocked = text / "out";
  expect_data_error([&] { prepare_char_dataset(text, blocked); }, blocked.string());
}

// ---- TokenFile ------------------------------------------------------------------------

TEST(TokenFile, MapsTheTokensAndMovesWithoutCopying) {
  const TempDir dir;
  const fs::path path = dir.path() / "synthetic.bin";
  write_synthetic(path);
  TokenFile file(path, 60000);
  ASSERT_EQ(file.size(), kSyntheticTokens);
  EXPECT_EQ(file.path(), path);
  for (std::int64_t i : {0, 1, 59999, 60000, 69999}) {
    EXPECT_EQ(file.tokens()[static_cast<std::size_t>(i)], synthetic_token(i));
  }
  const std::uint16_t* data = file.tokens().data();
  TokenFile moved = std::move(file);
  EXPECT_EQ(moved.tokens().data(), data);
  EXPECT_EQ(file.size(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
  TokenFile assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.tokens().data(), data);
  EXPECT_EQ(assigned.size(), kSyntheticTokens);
}

TEST(TokenFile, BadFilesThrowNamingThePath) {
  const TempDir dir;
  const fs::path missing = dir.path() / "missing.bin";
  expect_data_error([&] { TokenFile f(missing); }, missing.string());

  const fs::path odd = dir.path() / "odd.bin";
  write_file(odd, std::string(7, '\0'));
  expect_data_error([&] { TokenFile f(odd); }, odd.string());
  expect_data_error([&] { TokenFile f(odd); }, "7 bytes");

  const fs::path empty = dir.path() / "empty.bin";
  write_file(empty, "");
  expect_data_error([&] { TokenFile f(empty); }, empty.string());

  expect_data_error([&] { TokenFile f(dir.path()); }, dir.path().string());

  const fs::path out_of_vocab = dir.path() / "oov.bin";
  write_tokens(out_of_vocab, {1, 2, 64, 65, 3});
  expect_data_error([&] { TokenFile f(out_of_vocab, 65); }, out_of_vocab.string());
  expect_data_error([&] { TokenFile f(out_of_vocab, 65); }, "id 65 at token 3");
  EXPECT_EQ(TokenFile(out_of_vocab, 66).size(), 5);
  EXPECT_EQ(TokenFile(out_of_vocab).size(), 5);  // no vocabulary, no check
}

// ---- load_metadata --------------------------------------------------------------------

TEST(DataMetadata, RoundTripsAndRejectsBadFilesNamingThePath) {
  const TempDir dir;
  const fs::path path = dir.path() / "meta.json";
  const Metadata meta{.vocab = CharVocab::from_text("ba\n"),
                      .vocab_size = 3,
                      .sources = {"x.txt"},
                      .train_tokens = 9,
                      .val_tokens = 1};
  write_file(path, metadata_to_json(meta));
  const Metadata loaded = load_metadata(path);
  EXPECT_EQ(loaded.vocab.decode(std::vector<std::int32_t>{0, 1, 2}), "\nab");
  EXPECT_EQ(loaded.sources, std::vector<std::string>{"x.txt"});
  EXPECT_EQ(loaded.train_tokens, 9);
  EXPECT_EQ(loaded.val_tokens, 1);

  expect_data_error([&] { load_metadata(dir.path() / "none.json"); },
                    (dir.path() / "none.json").string());
  const auto expect_rejected = [&](const std::string& text, const std::string& needle) {
    write_file(path, text);
    expect_data_error([&] { load_metadata(path); }, path.string());
    expect_data_error([&] { load_metadata(path); }, needle);
  };
  expect_rejected("{\"format\": \"meshtrain-char-v1\", ", "not valid JSON");
  expect_rejected("[1, 2]", "not a JSON object");
  const std::string good_tail =
      R"("source": "x", "train_tokens": 9, "val_tokens": 1, "vocab_size": 2, "chars": [97, 98]})";
  expect_rejected(R"({"format": "gpt2-bpe", )" + good_tail, "gpt2-bpe");
  expect_rejected(R"({"source": "x", "train_tokens": 9, "val_tokens": 1})", "\"format\"");
  expect_rejected(
      R"({"format": "meshtrain-char-v1", "source": "x", "train_tokens": 9, "val_tokens": 1,
          "vocab_size": 3, "chars": [97, 98]})",
      "vocab_size");
  expect_rejected(
      R"({"format": "meshtrain-char-v1", "source": "x", "train_tokens": -1, "val_tokens": 1,
          "vocab_size": 2, "chars": [97, 98]})",
      "train_tokens");
  expect_rejected(
      R"({"format": "meshtrain-char-v1", "source": "x", "train_tokens": 9, "val_tokens": 1,
          "vocab_size": 2, "chars": [98, 97]})",
      "strictly increasing");
  expect_rejected(
      R"({"format": "meshtrain-char-v1", "source": "x", "train_tokens": 9, "val_tokens": 1,
          "vocab_size": 1, "chars": [300]})",
      "300");
}

// ---- GlobalBatchSampler ---------------------------------------------------------------

constexpr std::int64_t kSeqLen = 64;
constexpr std::int64_t kGlobalBatch = 32;
constexpr std::uint64_t kSeed = 1337;

struct Batch {
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
  bool operator==(const Batch&) const = default;
};

Batch fill_batch(const GlobalBatchSampler& sampler, std::int64_t step, std::int64_t first,
                 std::int64_t count) {
  Batch b{std::vector<std::int32_t>(static_cast<std::size_t>(count * sampler.seq_len())),
          std::vector<std::int32_t>(static_cast<std::size_t>(count * sampler.seq_len()))};
  sampler.fill(step, first, count, b.inputs.data(), b.targets.data());
  return b;
}

class GlobalBatchSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() / "synthetic.bin";
    write_synthetic(path_);
    file_ = TokenFile(path_, 60000);
  }
  TempDir dir_;
  fs::path path_;
  TokenFile file_;
};

TEST_F(GlobalBatchSamplerTest, SequencesAreTheWindowsTheFormulaNames) {
  const GlobalBatchSampler sampler(file_, kSeqLen, kGlobalBatch, kSeed, "train");
  const std::uint64_t stream = stream_of("train");
  for (std::int64_t step : {0, 1, 7, 123456}) {
    const Batch b = fill_batch(sampler, step, 0, kGlobalBatch);
    for (std::int64_t g = 0; g < kGlobalBatch; ++g) {
      // The documented formula, computed here independently of the sampler.
      const auto expected = static_cast<std::int64_t>(
          philox_u64(kSeed, stream, static_cast<std::uint64_t>(step * kGlobalBatch + g)) %
          static_cast<std::uint64_t>(kSyntheticTokens - kSeqLen));
      const std::int64_t offset = sampler.offset_of(step, g);
      ASSERT_EQ(offset, expected);
      ASSERT_GE(offset, 0);
      ASSERT_LT(offset + kSeqLen, kSyntheticTokens);  // the last target is inside the file
      for (std::int64_t j = 0; j < kSeqLen; ++j) {
        const auto k = static_cast<std::size_t>(g * kSeqLen + j);
        ASSERT_EQ(b.inputs[k], synthetic_token(offset + j)) << "step " << step << " seq " << g;
        ASSERT_EQ(b.targets[k], synthetic_token(offset + j + 1));
        if (j + 1 < kSeqLen) {
          ASSERT_EQ(b.targets[k], b.inputs[k + 1]);  // shifted by one
        }
      }
    }
  }
  // Offsets spread over the whole file: 10000 draws all land in range and reach both ends.
  std::int64_t lo = kSyntheticTokens, hi = -1;
  for (std::int64_t step = 0; step < 10000 / kGlobalBatch; ++step) {
    for (std::int64_t g = 0; g < kGlobalBatch; ++g) {
      const std::int64_t o = sampler.offset_of(step, g);
      ASSERT_TRUE(o >= 0 && o < kSyntheticTokens - kSeqLen);
      lo = std::min(lo, o);
      hi = std::max(hi, o);
    }
  }
  EXPECT_LT(lo, 1000);
  EXPECT_GT(hi, kSyntheticTokens - kSeqLen - 1000);
}

TEST_F(GlobalBatchSamplerTest, BatchDependsOnlyOnSeedSplitAndStep) {
  const TokenFile other_map(path_);  // a second mapping of the same file, as another rank has
  const GlobalBatchSampler a(file_, kSeqLen, kGlobalBatch, kSeed, "train");
  const GlobalBatchSampler b(other_map, kSeqLen, kGlobalBatch, kSeed, "train");
  EXPECT_EQ(fill_batch(a, 5, 0, kGlobalBatch), fill_batch(b, 5, 0, kGlobalBatch));
  // Order of calls does not matter: no state is carried between steps.
  const Batch step9 = fill_batch(a, 9, 0, kGlobalBatch);
  fill_batch(a, 3, 0, kGlobalBatch);
  EXPECT_EQ(fill_batch(a, 9, 0, kGlobalBatch), step9);

  EXPECT_NE(fill_batch(a, 5, 0, kGlobalBatch), fill_batch(a, 6, 0, kGlobalBatch));
  const GlobalBatchSampler val(file_, kSeqLen, kGlobalBatch, kSeed, "val");
  EXPECT_NE(fill_batch(a, 5, 0, kGlobalBatch), fill_batch(val, 5, 0, kGlobalBatch));
  const GlobalBatchSampler reseeded(file_, kSeqLen, kGlobalBatch, kSeed + 1, "train");
  EXPECT_NE(fill_batch(a, 5, 0, kGlobalBatch), fill_batch(reseeded, 5, 0, kGlobalBatch));
}

TEST_F(GlobalBatchSamplerTest, UnionOverDpRanksAndAccumulationIsTheGlobalBatch) {
  const GlobalBatchSampler sampler(file_, kSeqLen, kGlobalBatch, kSeed, "train");
  const std::int64_t step = 42;
  const Batch whole = fill_batch(sampler, step, 0, kGlobalBatch);
  for (int dp : {1, 2, 4}) {
    for (std::int64_t accumulation : {1, 2, 4}) {
      const std::int64_t micro_batch = kGlobalBatch / (dp * accumulation);
      // Reassemble what every (dp rank, accumulation step) filled at its global position.
      Batch assembled{std::vector<std::int32_t>(whole.inputs.size(), -1),
                      std::vector<std::int32_t>(whole.targets.size(), -1)};
      std::vector<int> times_filled(static_cast<std::size_t>(kGlobalBatch), 0);
      for (int rank = 0; rank < dp; ++rank) {
        for (std::int64_t a = 0; a < accumulation; ++a) {
          const std::int64_t first = first_sequence_of(a, rank, dp, micro_batch);
          const Batch part = fill_batch(sampler, step, first, micro_batch);
          std::copy(part.inputs.begin(), part.inputs.end(),
                    assembled.inputs.begin() + first * kSeqLen);
          std::copy(part.targets.begin(), part.targets.end(),
                    assembled.targets.begin() + first * kSeqLen);
          for (std::int64_t g = first; g < first + micro_batch; ++g) {
            ++times_filled[static_cast<std::size_t>(g)];
          }
        }
      }
      EXPECT_EQ(times_filled, std::vector<int>(static_cast<std::size_t>(kGlobalBatch), 1))
          << "dp " << dp << " accumulation " << accumulation;
      EXPECT_EQ(assembled, whole) << "dp " << dp << " accumulation " << accumulation;
    }
  }
  // The documented rule itself.
  EXPECT_EQ(first_sequence_of(0, 0, 2, 4), 0);
  EXPECT_EQ(first_sequence_of(0, 1, 2, 4), 4);
  EXPECT_EQ(first_sequence_of(1, 0, 2, 4), 8);
  EXPECT_EQ(first_sequence_of(3, 1, 2, 4), 28);
}

TEST_F(GlobalBatchSamplerTest, FileShorterThanSeqLenPlusOneThrowsNamingThePath) {
  const fs::path short_path = dir_.path() / "short.bin";
  write_synthetic(short_path, kSeqLen);
  const TokenFile short_file(short_path);
  expect_data_error([&] { GlobalBatchSampler s(short_file, kSeqLen, kGlobalBatch, kSeed, "val"); },
                    short_path.string());

  // seq_len + 1 tokens is enough: the only window starts at 0.
  const fs::path exact_path = dir_.path() / "exact.bin";
  write_synthetic(exact_path, kSeqLen + 1);
  const TokenFile exact_file(exact_path);
  const GlobalBatchSampler exact(exact_file, kSeqLen, 4, kSeed, "train");
  const Batch b = fill_batch(exact, 3, 0, 4);
  for (std::int64_t g = 0; g < 4; ++g) {
    EXPECT_EQ(exact.offset_of(3, g), 0);
    EXPECT_EQ(b.inputs[static_cast<std::size_t>(g * kSeqLen)], 0);
    EXPECT_EQ(b.targets[static_cast<std::size_t>((g + 1) * kSeqLen - 1)], kSeqLen);
  }
}

}  // namespace
}  // namespace meshtrain::data
