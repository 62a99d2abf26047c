// tests/fuzz/tokenizer_fuzz.cpp — the tokenizer files: GPT-2's encoder.json + vocab.bpe, and a
// SentencePiece .model.
//
// Input: one byte choosing the kind (even: GPT-2, odd: SentencePiece), then for GPT-2 the two
// files separated by the first NUL byte, for SentencePiece the model file. A tokenizer that
// loads encodes a fixed text and decodes every id it has.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "meshtrain/data/gpt2_bpe.h"
#include "meshtrain/data/sentencepiece_tokenizer.h"

namespace {

// Bounded by the input's size: an input claiming a huge vocabulary is not decoded id by id.
constexpr std::int64_t kMaxDecodedIds = 1 << 16;

void exercise(const meshtrain::data::Tokenizer& tokenizer) {
  std::vector<std::int32_t> ids;
  tokenizer.encode("Hello world, it's 2026!\n\xff\xfe caf\xc3\xa9 \xe4\xb8\xad", ids);
  tokenizer.decode(ids);
  ids.clear();
  for (std::int64_t id = 0; id < std::min(tokenizer.vocab_size(), kMaxDecodedIds); ++id) {
    ids.push_back(static_cast<std::int32_t>(id));
  }
  tokenizer.decode(ids);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain::data;
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  meshtrain::fuzz::refuse_cleanly([&] {
    if (data[0] % 2 == 0) {
      const std::size_t cut = std::min(input.find('\0'), input.size());
      const Gpt2Bpe bpe(input.substr(0, cut), input.substr(std::min(cut + 1, input.size())),
                        "encoder.json", "vocab.bpe");
      exercise(bpe);
    } else {
      const SentencePieceTokenizer spm(std::string(input), "tokenizer.model");
      exercise(spm);
    }
  });
  return 0;
}
