// tests/fuzz/token_file_fuzz.cpp — a token file (train.bin / val.bin): raw ids, or llm.c's
// 1024-byte header then ids.
//
// Input: one byte of options (bit 0: llm.c layout, bit 1: uint32 ids when raw, bit 2: check
// the ids against a vocabulary of 50,257), then the file. Every id is read back.
#include <vector>

#include "fuzz_support.h"
#include "meshtrain/data/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain::data;
  if (size == 0) return 0;
  const std::uint8_t flags = data[0];
  const TokenFileOptions options{
      .layout = (flags & 1) != 0 ? TokenLayout::llmc : TokenLayout::raw,
      .dtype = (flags & 2) != 0 ? TokenDtype::u32 : TokenDtype::u16,
      .vocab_size = (flags & 4) != 0 ? std::optional<std::int64_t>(50257) : std::nullopt};
  const std::filesystem::path path = meshtrain::fuzz::scratch_dir() / "fuzz.bin";
  meshtrain::fuzz::write_file(
      path, std::span<const std::byte>(reinterpret_cast<const std::byte*>(data) + 1, size - 1));
  meshtrain::fuzz::refuse_cleanly([&] {
    const TokenFile file(path, options);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(file.size()));
    if ((flags & 4) != 0) file.ids().copy_to(0, ids);  // ids < 2^31 only when checked
    for (std::int64_t i = 0; i < file.size(); ++i) file.ids().at(i);
  });
  return 0;
}
