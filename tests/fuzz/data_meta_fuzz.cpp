// tests/fuzz/data_meta_fuzz.cpp — a prepared dataset's meta.json (v2 and v1).
//
// load_metadata on the input; for a char vocabulary also load_tokenizer (which needs no file),
// and a round trip through encode/decode of every byte the vocabulary holds.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "meshtrain/data/metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain::data;
  const std::filesystem::path dir = meshtrain::fuzz::scratch_dir();
  meshtrain::fuzz::write_file(dir / kMetaJsonName,
                              std::string_view(reinterpret_cast<const char*>(data), size));
  meshtrain::fuzz::refuse_cleanly([&] {
    const Metadata meta = load_metadata(dir / kMetaJsonName);
    if (meta.tokenizer != TokenizerKind::char_bytes) return;
    const auto tokenizer = load_tokenizer(meta, dir);
    const std::span<const std::uint8_t> chars = meta.vocab.chars();
    std::vector<std::int32_t> ids;
    tokenizer->encode(std::string(chars.begin(), chars.end()), ids);
    tokenizer->decode(ids);
  });
  return 0;
}
