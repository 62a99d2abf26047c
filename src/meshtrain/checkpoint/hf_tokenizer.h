// src/meshtrain/checkpoint/hf_tokenizer.h
//
// The tokenizer files `meshtrain export` writes beside the model so that transformers'
// AutoTokenizer.from_pretrained(export dir) loads the run's tokenizer (transformers 4.36.2):
//   gpt2           vocab.json (= the run's encoder.json) and merges.txt (= vocab.bpe, whose
//                  "#version" first line GPT2Tokenizer skips), tokenizer_config.json naming
//                  GPT2Tokenizer (AutoTokenizer builds GPT2TokenizerFast from these files),
//                  special_tokens_map.json: <|endoftext|> as bos, eos and unk, no prefix space.
//                  The ids are those of OpenAI's encoder.py and tiktoken's "gpt2" encoding.
//   sentencepiece  tokenizer.model (copied) and tokenizer_config.json naming LlamaTokenizer
//                  with add_bos_token / add_eos_token false (meshtrain's ids carry no BOS/EOS
//                  the model did not see), bos <s>, eos </s>, unk <unk> (SentencePiece's
//                  defaults), legacy true (SentencePiece's own encoding).
//   char           none: Hugging Face has no tokenizer class for meshtrain's byte vocabulary
//                  (the ids are positions in meta.json's "chars"); the export says so and
//                  `meshtrain sample` decodes such models.
// The tokenizer's files are those a prepared dataset and a final checkpoint carry beside their
// meta.json (format meshtrain-tokens-v2, tokenizer.kind "char" / "gpt2" / "sentencepiece";
// docs/tokenizers.md): encoder.json + vocab.bpe, or tokenizer.model.
// Uses: core/ (StagedFile, errors), nlohmann_json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

/// The files to write, read and checked, none written yet.
struct HfTokenizerFiles {
  struct File {
    std::string name;  // in the export directory
    std::string bytes;
  };
  std::vector<File> files;  // empty for "char"
  std::string note;         // one sentence for the export's message
};

/// Reads and checks the tokenizer of `kind` ("char", "gpt2" or "sentencepiece") from
/// `source_dir` (where its files lie) for a model of `vocab_size` ids and `model_max_length`
/// positions. Throws DataError naming the file for a missing or unreadable file, an
/// encoder.json that is not a JSON object of token → id with ids in [0, vocab_size) and
/// <|endoftext|> among them, a vocab.bpe without its "#version" first line, an empty
/// tokenizer.model; and for an unknown kind. Files at most 64 MiB each.
HfTokenizerFiles read_hf_tokenizer(std::string_view kind, const std::filesystem::path& source_dir,
                                   std::int64_t vocab_size, std::int64_t model_max_length);

/// The tokenizer file names AutoTokenizer reads from a directory (transformers 4.36.2's
/// GPT2Tokenizer, LlamaTokenizer and their fast forms).
inline constexpr std::string_view kHfTokenizerFileNames[] = {
    "vocab.json",      "merges.txt",     "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model", "tokenizer.json", "added_tokens.json"};

/// Writes `files` into `dir`, each atomically (temporary name, fsync, rename), and removes the
/// kHfTokenizerFileNames that `files` does not hold from `dir`: an earlier export's vocab.json
/// beside a char model would make AutoTokenizer load a 50,257-id tokenizer for a 65-id model.
/// Returns the names removed. Throws DataError naming the file that cannot be written or
/// removed.
std::vector<std::string> write_hf_tokenizer(const HfTokenizerFiles& files,
                                            const std::filesystem::path& dir);

}  // namespace meshtrain
