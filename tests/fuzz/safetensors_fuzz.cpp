// tests/fuzz/safetensors_fuzz.cpp — a safetensors file: the 8-byte header length, the JSON
// header, the data.
//
// Both readers: decode_safetensors on the bytes (a sharded checkpoint's rank files, F32/I32)
// and read_safetensors_index + read_safetensors_tensor on a file (Hugging Face weights, also
// BF16/F16), reading every tensor the header lists.
#include <span>

#include "fuzz_support.h"
#include "meshtrain/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  meshtrain::fuzz::refuse_cleanly(
      [&] { meshtrain::decode_safetensors(bytes, "fuzz.safetensors"); });
  const std::filesystem::path path = meshtrain::fuzz::scratch_dir() / "fuzz.safetensors";
  meshtrain::fuzz::write_file(path, bytes);
  meshtrain::fuzz::refuse_cleanly([&] {
    const meshtrain::SafetensorsIndex index = meshtrain::read_safetensors_index(path);
    for (const auto& [name, entry] : index.entries) meshtrain::read_safetensors_tensor(index, name);
  });
  return 0;
}
