// Tests of the token files people already have and of the epoch sampler (docs/data.md):
// meshtrain's uint32 files, nanoGPT's raw uint16 .bin and llm.c's headed .bin read back what
// the test wrote, each bad file is a DataError naming it; the epoch order visits every window
// once per epoch in a different order per epoch, seed and split, equals the documented formula
// recomputed here, and is layout-invariant; TrainData reads each data.format.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "support/temp_files.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/data/epoch_sampler.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/data/token_file.h"
#include "meshtrain/train/train_data.h"

namespace meshtrain::data {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

void write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void append(std::vector<char>& bytes, T value) {  // little-endian: the host's order (asserted)
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  bytes.insert(bytes.end(), raw, raw + sizeof(T));
}

// Raw ids of width T, no header (nanoGPT's np.uint16 tofile, or meshtrain's uint32).
template <typename T>
void write_raw(const fs::path& path, const std::vector<std::int64_t>& ids) {
  std::vector<char> bytes;
  for (const std::int64_t id : ids) append(bytes, static_cast<T>(id));
  write_bytes(path, bytes);
}

// llm.c's write_datafile: 256 int32 (magic, version, count, zeros), then the ids.
template <typename T>
void write_llmc(const fs::path& path, const std::vector<std::int64_t>& ids, std::int32_t magic,
                std::int32_t version, std::int64_t header_count = -1) {
  std::vector<char> bytes;
  append(bytes, magic);
  append(bytes, version);
  append(bytes, static_cast<std::int32_t>(header_count < 0 ? std::ssize(ids) : header_count));
  for (int i = 3; i < 256; ++i) append(bytes, std::int32_t{0});
  for (const std::int64_t id : ids) append(bytes, static_cast<T>(id));
  write_bytes(path, bytes);
}

// Token i of a synthetic corpus: above 65,535 for uint32 files, so a 16-bit read would show.
std::int64_t token32(std::int64_t i) { return (i * 7919) % 128256; }
std::vector<std::int64_t> corpus(std::int64_t n, std::int64_t (*token)(std::int64_t)) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = token(i);
  return ids;
}
std::int64_t token16(std::int64_t i) { return (i * 31) % 50257; }

void expect_data_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected a DataError";
  } catch (const DataError& e) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << needle << "'";
    }
  }
}

std::vector<std::int64_t> read_all(const TokenFile& file) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(file.size()));
  file.ids().copy_to(0, out);
  return {out.begin(), out.end()};
}

// ---- token files ------------------------------------------------------------------------

TEST(TokenFormats, Uint32RawFileReadsBackIdsAbove65535) {
  const TempDir dir;
  const fs::path path = dir.path() / "train.bin";
  const std::vector<std::int64_t> ids = corpus(5000, token32);
  write_raw<std::uint32_t>(path, ids);
  const TokenFile file(path, {.dtype = TokenDtype::u32, .vocab_size = 128256});
  EXPECT_EQ(file.dtype(), TokenDtype::u32);
  ASSERT_EQ(file.size(), 5000);
  EXPECT_EQ(read_all(file), ids);
  EXPECT_EQ(file.tokens32()[17], token32(17));
  EXPECT_EQ(file.ids().at(4999), token32(4999));
  EXPECT_GT(*std::max_element(ids.begin(), ids.end()), 65535);
  // The same bytes read as uint16 are other ids: the width is not guessed.
  EXPECT_EQ(TokenFile(path).size(), 10000);
}

TEST(TokenFormats, NanoGptRawUint16ReadsBack) {
  const TempDir dir;
  const fs::path path = dir.path() / "val.bin";
  const std::vector<std::int64_t> ids = corpus(3001, token16);
  write_raw<std::uint16_t>(path, ids);
  const TokenFile file(path, {.layout = TokenLayout::raw, .vocab_size = 50257});
  EXPECT_EQ(file.dtype(), TokenDtype::u16);
  EXPECT_EQ(read_all(file), ids);
}

TEST(TokenFormats, LlmcGpt2AndLlama3FilesReadBackWithoutTheirHeader) {
  const TempDir dir;
  const fs::path gpt2 = dir.path() / "tiny_shakespeare_train.bin";
  const std::vector<std::int64_t> ids16 = corpus(777, token16);
  write_llmc<std::uint16_t>(gpt2, ids16, kLlmcMagicGpt2, kLlmcVersionGpt2);
  const TokenFile g(gpt2, {.layout = TokenLayout::llmc, .vocab_size = 50257});
  EXPECT_EQ(g.dtype(), TokenDtype::u16);
  EXPECT_EQ(g.size(), 777);
  EXPECT_EQ(read_all(g), ids16);

  const fs::path llama = dir.path() / "llama_train.bin";
  const std::vector<std::int64_t> ids32 = corpus(555, token32);
  write_llmc<std::uint32_t>(llama, ids32, kLlmcMagicLlama3, kLlmcVersionLlama3);
  // The header names the width: TokenFileOptions::dtype is not consulted for llm.c files.
  const TokenFile l(llama,
                    {.layout = TokenLayout::llmc, .dtype = TokenDtype::u16, .vocab_size = 128256});
  EXPECT_EQ(l.dtype(), TokenDtype::u32);
  EXPECT_EQ(l.size(), 555);
  EXPECT_EQ(read_all(l), ids32);
  // llm.c's numbers (dev/data/data_common.py, HEADERS_INFO).
  EXPECT_EQ(kLlmcMagicGpt2, 20240520);
  EXPECT_EQ(kLlmcVersionGpt2, 1);
  EXPECT_EQ(kLlmcMagicLlama3, 20240801);
  EXPECT_EQ(kLlmcVersionLlama3, 7);
  EXPECT_EQ(kLlmcHeaderBytes, 1024);
}

TEST(TokenFormats, BadLlmcFilesAreDataErrorsNamingTheFileAndTheField) {
  const TempDir dir;
  const TokenFileOptions llmc{.layout = TokenLayout::llmc, .vocab_size = 50257};
  const std::vector<std::int64_t> ids = corpus(100, token16);
  const fs::path magic = dir.path() / "magic.bin";
  write_llmc<std::uint16_t>(magic, ids, 20240521, 1);
  expect_data_error([&] { TokenFile f(magic, llmc); },
                    {magic.string(), "magic 20240521", "20240520", "20240801"});

  const fs::path version = dir.path() / "version.bin";
  write_llmc<std::uint16_t>(version, ids, kLlmcMagicGpt2, 7);
  expect_data_error([&] { TokenFile f(version, llmc); },
                    {version.string(), "version 7", "version 1"});

  const fs::path longer = dir.path() / "count.bin";  // the header claims more than is there
  write_llmc<std::uint16_t>(longer, ids, kLlmcMagicGpt2, kLlmcVersionGpt2, 101);
  expect_data_error([&] { TokenFile f(longer, llmc); },
                    {longer.string(), "1224 bytes", "101 uint16 tokens", "1226 bytes"});

  const fs::path none = dir.path() / "none.bin";
  write_llmc<std::uint16_t>(none, {}, kLlmcMagicGpt2, kLlmcVersionGpt2);
  expect_data_error([&] { TokenFile f(none, llmc); }, {none.string(), "0 uint16 tokens"});

  const fs::path short_file = dir.path() / "short.bin";  // a raw nanoGPT file given as llm.c
  write_raw<std::uint16_t>(short_file, ids);
  expect_data_error([&] { TokenFile f(short_file, llmc); },
                    {short_file.string(), "200 bytes", "1024-byte header"});

  const fs::path empty = dir.path() / "empty.bin";
  write_bytes(empty, {});
  expect_data_error([&] { TokenFile f(empty, llmc); }, {empty.string(), "empty"});

  const fs::path oov = dir.path() / "oov.bin";
  std::vector<std::int64_t> bad = ids;
  bad[42] = 50257;
  write_llmc<std::uint16_t>(oov, bad, kLlmcMagicGpt2, kLlmcVersionGpt2);
  expect_data_error([&] { TokenFile f(oov, llmc); },
                    {oov.string(), "id 50257 at token 42", "[0, 50257)"});
}

TEST(TokenFormats, BadRawFilesAreDataErrorsNamingTheFile) {
  const TempDir dir;
  const fs::path six = dir.path() / "six.bin";
  write_bytes(six, std::vector<char>(6, 0));
  expect_data_error([&] { TokenFile f(six, {.dtype = TokenDtype::u32, .vocab_size = {}}); },
                    {six.string(), "6 bytes", "uint32", "multiple of 4"});

  const fs::path oov = dir.path() / "oov32.bin";
  write_raw<std::uint32_t>(oov, {5, 69999, 70000, 1});
  expect_data_error([&] { TokenFile f(oov, {.dtype = TokenDtype::u32, .vocab_size = 70000}); },
                    {oov.string(), "id 70000 at token 2", "[0, 70000)"});
  EXPECT_EQ(TokenFile(oov, {.dtype = TokenDtype::u32, .vocab_size = 70001}).size(), 4);

  // An llm.c file read as raw: its header is out of any GPT-2 vocabulary, and the message
  // says which format it is.
  const fs::path headed = dir.path() / "headed.bin";
  write_llmc<std::uint16_t>(headed, corpus(10, token16), kLlmcMagicGpt2, kLlmcVersionGpt2);
  expect_data_error([&] { TokenFile f(headed, {.vocab_size = 50257}); },
                    {headed.string(), "data.format = \"llmc\""});
}

// ---- epoch order ----------------------------------------------------------------------

TEST(EpochOrder, WindowCountIsMegatronsSampleCount) {
  EXPECT_EQ(window_count(64, 64), 0);  // one short of a window and its last target
  EXPECT_EQ(window_count(65, 64), 1);
  EXPECT_EQ(window_count(128, 64), 1);
  EXPECT_EQ(window_count(129, 64), 2);
  EXPECT_EQ(window_count(1003854, 256), 3921);  // Tiny Shakespeare's train split
}

TEST(EpochOrder, EachEpochIsABijectionWithItsOwnOrder) {
  for (const std::int64_t windows : {1, 2, 3, 4, 5, 16, 17, 100, 1093, 4097}) {
    const EpochOrder order(windows, 1337, stream_of("train"));
    std::vector<std::vector<std::int64_t>> epochs;
    for (std::int64_t e = 0; e < 3; ++e) {
      std::vector<std::int64_t> seen;
      for (std::int64_t p = 0; p < windows; ++p) seen.push_back(order.permute(e, p));
      std::vector<std::int64_t> sorted = seen;
      std::sort(sorted.begin(), sorted.end());
      std::vector<std::int64_t> all(static_cast<std::size_t>(windows));
      for (std::int64_t w = 0; w < windows; ++w) all[static_cast<std::size_t>(w)] = w;
      ASSERT_EQ(sorted, all) << windows << " windows, epoch " << e;
      epochs.push_back(seen);
    }
    if (windows >= 5) {  // 4 windows have 24 orders: two epochs may agree by chance
      EXPECT_NE(epochs[0], epochs[1]) << windows;
      EXPECT_NE(epochs[1], epochs[2]) << windows;
    }
  }
}

TEST(EpochOrder, LooksShuffled) {
  // A permutation of 4097 windows: few fixed points (1 expected) and few neighbours kept
  // neighbours (≈ 2 expected), unlike the identity or a rotation.
  const std::int64_t windows = 4097;
  const EpochOrder order(windows, 1337, stream_of("train"));
  int fixed = 0, adjacent = 0;
  for (std::int64_t p = 0; p < windows; ++p) {
    const std::int64_t w = order.permute(0, p);
    fixed += w == p;
    if (p + 1 < windows) adjacent += order.permute(0, p + 1) == w + 1;
  }
  EXPECT_LT(fixed, 10);
  EXPECT_LT(adjacent, 10);
}

// The documented permutation (epoch_sampler.h), written out here independently: key_e =
// philox_u64(seed, stream, e); four Feistel rounds on h-bit halves with round function
// philox_u64(key_e, stream, r·2^32 + right); cycle walking into [0, W).
std::int64_t documented_window(std::int64_t windows, std::uint64_t seed, std::uint64_t stream,
                               std::int64_t sample) {
  const std::int64_t epoch = sample / windows;
  int bits = 0;
  while ((std::uint64_t{1} << bits) < static_cast<std::uint64_t>(windows)) ++bits;
  const int h = std::max(1, (bits + 1) / 2);
  const std::uint64_t mask = (std::uint64_t{1} << h) - 1;
  const std::uint64_t key = philox_u64(seed, stream, static_cast<std::uint64_t>(epoch));
  auto x = static_cast<std::uint64_t>(sample % windows);
  do {
    std::uint64_t left = x >> h, right = x & mask;
    for (std::uint64_t r = 0; r < 4; ++r) {
      const std::uint64_t next = left ^ (philox_u64(key, stream, (r << 32) | right) & mask);
      left = right;
      right = next;
    }
    x = (left << h) | right;
  } while (x >= static_cast<std::uint64_t>(windows));
  return static_cast<std::int64_t>(x);
}

constexpr std::int64_t kSeqLen = 64;
constexpr std::int64_t kGlobalBatch = 32;
constexpr std::uint64_t kSeed = 1337;
constexpr std::int64_t kTokens = 70000;  // 1093 windows of 65 tokens at stride 64

std::int64_t token_at(std::int64_t i) { return i % 60000; }

class EpochSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_raw<std::uint16_t>(dir_.path() / "train.bin", corpus(kTokens, token_at));
    file_ = TokenFile(dir_.path() / "train.bin", 60000);
  }
  GlobalBatchSampler sampler(std::string_view split, std::uint64_t seed = kSeed) const {
    return GlobalBatchSampler(file_, kSeqLen, kGlobalBatch, seed, split, SampleOrder::epoch);
  }
  // Window of every global sample in [0, samples), as the sampler's offsets say.
  std::vector<std::int64_t> windows_of(const GlobalBatchSampler& s, std::int64_t samples) const {
    std::vector<std::int64_t> out;
    for (std::int64_t i = 0; i < samples; ++i) {
      const std::int64_t offset = s.offset_of(i / kGlobalBatch, i % kGlobalBatch);
      EXPECT_EQ(offset % kSeqLen, 0);
      out.push_back(offset / kSeqLen);
    }
    return out;
  }
  TempDir dir_;
  TokenFile file_;
};

TEST_F(EpochSamplerTest, EveryWindowExactlyOncePerEpochInANewOrder) {
  const std::int64_t windows = window_count(kTokens, kSeqLen);
  ASSERT_EQ(windows, 1093);
  const GlobalBatchSampler s = sampler("train");
  const std::vector<std::int64_t> seen = windows_of(s, 3 * windows);
  std::vector<std::vector<std::int64_t>> epochs(3);
  for (std::size_t i = 0; i < seen.size(); ++i) epochs[i / windows].push_back(seen[i]);
  for (const auto& epoch : epochs) {
    const std::set<std::int64_t> distinct(epoch.begin(), epoch.end());
    EXPECT_EQ(std::ssize(distinct), windows);  // once each, none missing
    EXPECT_EQ(*distinct.begin(), 0);
    EXPECT_EQ(*distinct.rbegin(), windows - 1);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_DOUBLE_EQ(s.epochs_after(windows), 1.0);
  EXPECT_DOUBLE_EQ(s.epochs_after(3 * windows / 2), 1.5 - 0.5 / static_cast<double>(windows));
}

TEST_F(EpochSamplerTest, WindowsAreTheDocumentedFormulaAndHoldTheFilesTokens) {
  const std::int64_t windows = window_count(kTokens, kSeqLen);
  const GlobalBatchSampler s = sampler("train");
  for (const std::int64_t step : {0, 1, 33, 34, 35, 68, 1000}) {  // epoch boundaries at 1093·k
    std::vector<std::int32_t> in(kGlobalBatch * kSeqLen), target(kGlobalBatch * kSeqLen);
    s.fill(step, 0, kGlobalBatch, in.data(), target.data());
    for (std::int64_t g = 0; g < kGlobalBatch; ++g) {
      const std::int64_t w =
          documented_window(windows, kSeed, stream_of("train"), step * kGlobalBatch + g);
      ASSERT_EQ(s.offset_of(step, g), w * kSeqLen) << "step " << step << " sequence " << g;
      for (std::int64_t j = 0; j < kSeqLen; ++j) {
        const auto k = static_cast<std::size_t>(g * kSeqLen + j);
        ASSERT_EQ(in[k], token_at(w * kSeqLen + j));
        ASSERT_EQ(target[k], token_at(w * kSeqLen + j + 1));
      }
    }
  }
}

TEST_F(EpochSamplerTest, OrderDependsOnSeedAndSplitOnly) {
  const std::int64_t samples = 200;
  const std::vector<std::int64_t> train = windows_of(sampler("train"), samples);
  EXPECT_NE(train, windows_of(sampler("val"), samples));
  EXPECT_NE(train, windows_of(sampler("train", kSeed + 1), samples));
  // A second mapping, as another rank has, and any order of calls: the same windows. Resuming
  // at step s (mid-epoch) asks only for step s.
  const TokenFile other(dir_.path() / "train.bin");
  const GlobalBatchSampler again(other, kSeqLen, kGlobalBatch, kSeed, "train", SampleOrder::epoch);
  EXPECT_EQ(again.offset_of(40, 5), sampler("train").offset_of(40, 5));
  EXPECT_EQ(windows_of(again, samples), train);
}

TEST_F(EpochSamplerTest, UnionOverDpRanksAndAccumulationIsTheGlobalBatch) {
  const GlobalBatchSampler s = sampler("train");
  const std::int64_t step = 34;  // crosses the first epoch boundary (sample 1093)
  std::vector<std::int32_t> whole(kGlobalBatch * kSeqLen), whole_t(kGlobalBatch * kSeqLen);
  s.fill(step, 0, kGlobalBatch, whole.data(), whole_t.data());
  for (const int dp : {1, 2, 4}) {
    for (const std::int64_t accumulation : {1, 2, 4}) {
      const std::int64_t micro = kGlobalBatch / (dp * accumulation);
      std::vector<std::int32_t> got(whole.size(), -1), got_t(whole.size(), -1);
      for (int rank = 0; rank < dp; ++rank) {
        for (std::int64_t a = 0; a < accumulation; ++a) {
          const std::int64_t first = first_sequence_of(a, rank, dp, micro);
          s.fill(step, first, micro, got.data() + first * kSeqLen, got_t.data() + first * kSeqLen);
        }
      }
      EXPECT_EQ(got, whole) << "dp " << dp << " accumulation " << accumulation;
      EXPECT_EQ(got_t, whole_t) << "dp " << dp << " accumulation " << accumulation;
    }
  }
}

TEST_F(EpochSamplerTest, Uint32FileThroughTheSampler) {
  const fs::path path = dir_.path() / "u32.bin";
  write_raw<std::uint32_t>(path, corpus(4000, token32));
  const TokenFile file(path, {.dtype = TokenDtype::u32, .vocab_size = 128256});
  for (const SampleOrder order : {SampleOrder::random, SampleOrder::epoch}) {
    const GlobalBatchSampler s(file, kSeqLen, 4, kSeed, "train", order);
    std::vector<std::int32_t> in(4 * kSeqLen), target(4 * kSeqLen);
    s.fill(7, 0, 4, in.data(), target.data());
    for (std::int64_t g = 0; g < 4; ++g) {
      const std::int64_t offset = s.offset_of(7, g);
      for (std::int64_t j = 0; j < kSeqLen; ++j) {
        ASSERT_EQ(in[static_cast<std::size_t>(g * kSeqLen + j)], token32(offset + j));
        ASSERT_EQ(target[static_cast<std::size_t>(g * kSeqLen + j)], token32(offset + j + 1));
      }
    }
  }
}

// ---- TrainData: each data.format through the trainer's reader ----------------------------

Config foreign_config(const fs::path& dir, DataFormat format, std::int64_t vocab) {
  Config c;
  c.source = "test";
  c.model.block_size = 16;
  c.model.vocab_size = vocab;
  c.training.micro_batch = 4;
  c.data.dir = dir.string();
  c.data.format = format;
  return c;
}

TEST(TrainDataFormats, NanoGptAndLlmcFilesWithTheirNamesAndTheConfigsVocabulary) {
  const TempDir dir;
  write_raw<std::uint16_t>(dir.path() / "train.bin", corpus(3000, token16));
  write_raw<std::uint16_t>(dir.path() / "val.bin", corpus(500, token16));
  Config nano = foreign_config(dir.path(), DataFormat::nanogpt, 50257);
  const TrainData a(nano, load_run_metadata(nano));
  EXPECT_EQ(a.metadata().vocab_size, 50257);
  EXPECT_EQ(a.metadata().train_tokens, 3000);
  EXPECT_EQ(a.metadata().val_tokens, 500);
  EXPECT_EQ(a.train().order(), SampleOrder::random);
  std::vector<std::int32_t> tokens(4 * 16), next(4 * 16);
  a.train().fill(3, 0, 4, tokens.data(), next.data());
  EXPECT_EQ(tokens[16], token16(a.train().offset_of(3, 1)));
  EXPECT_EQ(next[16], token16(a.train().offset_of(3, 1) + 1));

  write_llmc<std::uint32_t>(dir.path() / "tiny_train.bin", corpus(2000, token32), kLlmcMagicLlama3,
                            kLlmcVersionLlama3);
  write_llmc<std::uint32_t>(dir.path() / "tiny_val.bin", corpus(300, token32), kLlmcMagicLlama3,
                            kLlmcVersionLlama3);
  Config llmc = foreign_config(dir.path(), DataFormat::llmc, 128256);
  llmc.data.train_file = "tiny_train.bin";
  llmc.data.val_file = "tiny_val.bin";
  llmc.data.sampler = DataSampler::epoch;
  const TrainData b(llmc, load_run_metadata(llmc));
  EXPECT_EQ(b.metadata().token_dtype, TokenDtype::u32);
  EXPECT_EQ(b.metadata().train_tokens, 2000);
  EXPECT_EQ(b.train().order(), SampleOrder::epoch);
  EXPECT_EQ(b.val().order(), SampleOrder::epoch);
  std::vector<std::int32_t> in(4 * 16), target(4 * 16);
  b.val().fill(0, 0, 4, in.data(), target.data());
  EXPECT_EQ(in[0], token32(b.val().offset_of(0, 0)));

  // A vocabulary smaller than the file's ids names the file, the id and its index.
  Config small = llmc;
  small.model.vocab_size = 1000;
  expect_data_error([&] { TrainData t(small, load_run_metadata(small)); },
                    {(dir.path() / "tiny_train.bin").string(), "id 7919 at token 1"});
}

// Too little data for one sequence names the setting that decides it (issue 17 item 8: it
// said `seq_len`), its value, the rule and a fix, for either split.
TEST(TrainDataFormats, AFileShorterThanOneSequenceNamesModelBlockSize) {
  const TempDir dir;
  write_raw<std::uint16_t>(dir.path() / "train.bin", corpus(3000, token16));
  write_raw<std::uint16_t>(dir.path() / "val.bin", corpus(10, token16));
  Config nano = foreign_config(dir.path(), DataFormat::nanogpt, 50257);
  expect_data_error(
      [&] { TrainData t(nano, load_run_metadata(nano)); },
      {"model.block_size = 16", "the val split's token file", (dir.path() / "val.bin").string(),
       "holds 10 tokens", "fewer than model.block_size + 1 = 17",
       "lower model.block_size to at most 9, or use a larger corpus"});
  Config longer = nano;
  longer.model.block_size = 3000;
  expect_data_error([&] { TrainData t(longer, load_run_metadata(longer)); },
                    {"model.block_size = 3000", "the train split's token file",
                     "fewer than model.block_size + 1 = 3001", "at most 2999"});
  longer.model.block_size = 9;  // one sequence and its targets: enough
  EXPECT_NO_THROW(TrainData(longer, load_run_metadata(longer)));
}

}  // namespace
}  // namespace meshtrain::data
