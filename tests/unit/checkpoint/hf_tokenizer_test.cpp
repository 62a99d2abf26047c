// checkpoint/hf_tokenizer.h: which Hugging Face tokenizer files an export gets for each
// tokenizer kind, and the errors for missing or malformed source files (transformers loading
// them: tests/reference/hf_export_tokenizer_reference.py).
#include "meshtrain/checkpoint/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  // The pid keeps concurrent runs (several checkouts on one machine) apart.
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A 3-token GPT-2 style tokenizer: two bytes and <|endoftext|>, one merge.
void write_gpt2(const fs::path& dir) {
  write(dir / "encoder.json", R"({"a": 0, "b": 1, "<|endoftext|>": 2})");
  write(dir / "vocab.bpe", "#version: 0.2\na b\n");
}

void expect_data_error(const std::function<void()>& f, const std::string& says) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << says;
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(HfTokenizer, Gpt2GetsVocabMergesAndAConfigNamingGpt2Tokenizer) {
  const TempDir src("meshtrain_hf_tok_src"), out("meshtrain_hf_tok_out");
  write_gpt2(src.path);
  const HfTokenizerFiles files = read_hf_tokenizer("gpt2", src.path, 3, 1024);
  ASSERT_EQ(files.files.size(), 4u);
  write_hf_tokenizer(files, out.path);
  EXPECT_EQ(read(out.path / "vocab.json"), read(src.path / "encoder.json"));
  EXPECT_EQ(read(out.path / "merges.txt"), read(src.path / "vocab.bpe"));
  const auto config = nlohmann::json::parse(read(out.path / "tokenizer_config.json"));
  EXPECT_EQ(config["tokenizer_class"], "GPT2Tokenizer");
  EXPECT_EQ(config["model_max_length"], 1024);
  EXPECT_EQ(config["eos_token"], "<|endoftext|>");
  EXPECT_EQ(config["add_prefix_space"], false);
  EXPECT_TRUE(fs::exists(out.path / "special_tokens_map.json"));
}

TEST(HfTokenizer, SentencePieceGetsTheModelAndALlamaTokenizerConfig) {
  const TempDir src("meshtrain_hf_tok_sp");
  write(src.path / "tokenizer.model", "not parsed here");
  const HfTokenizerFiles files = read_hf_tokenizer("sentencepiece", src.path, 100, 64);
  ASSERT_EQ(files.files.size(), 3u);
  EXPECT_EQ(files.files[0].name, "tokenizer.model");
  EXPECT_EQ(files.files[0].bytes, "not parsed here");
  const auto config = nlohmann::json::parse(files.files[1].bytes);
  EXPECT_EQ(config["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(config["add_bos_token"], false);
}

TEST(HfTokenizer, CharWritesNothingAndSaysWhy) {
  const TempDir src("meshtrain_hf_tok_char");
  const HfTokenizerFiles files = read_hf_tokenizer("char", src.path, 65, 64);
  EXPECT_TRUE(files.files.empty());
  EXPECT_NE(files.note.find("no tokenizer class"), std::string::npos) << files.note;
}

TEST(HfTokenizer, MissingOrMalformedFilesAreDataErrorsNamingTheFile) {
  const TempDir src("meshtrain_hf_tok_bad");
  const auto gpt2 = [&](std::int64_t vocab) {
    return [&, vocab] { read_hf_tokenizer("gpt2", src.path, vocab, 8); };
  };
  expect_data_error(gpt2(3),
                    (src.path / "encoder.json").string() + ": the GPT-2 encoder.json is missing");
  write_gpt2(src.path);
  expect_data_error(gpt2(2), "token \"<|endoftext|>\" has id 2, outside the model's [0, 2)");
  write(src.path / "encoder.json", "[1]");
  expect_data_error(gpt2(3), "not a JSON object of token → id");
  write(src.path / "encoder.json", R"({"a": 0, "b": 1})");
  expect_data_error(gpt2(3), "no <|endoftext|> token");
  write_gpt2(src.path);
  write(src.path / "vocab.bpe", "a b\n");
  expect_data_error(gpt2(3), (src.path / "vocab.bpe").string() + ": the first line is not");
  fs::remove(src.path / "vocab.bpe");
  expect_data_error(gpt2(3), "the GPT-2 vocab.bpe is missing");
  write(src.path / "tokenizer.model", "");
  expect_data_error([&] { read_hf_tokenizer("sentencepiece", src.path, 8, 8); },
                    "empty SentencePiece model");
  expect_data_error([&] { read_hf_tokenizer("wordpiece", src.path, 8, 8); },
                    "unknown tokenizer kind \"wordpiece\"");
}

}  // namespace
}  // namespace meshtrain
