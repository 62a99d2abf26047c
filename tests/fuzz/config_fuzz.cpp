// tests/fuzz/config_fuzz.cpp — the TOML config and its command-line overrides.
//
// Input: the TOML text, then optionally NUL-separated command-line arguments
// ("--training.steps\09" …) that go through parse_overrides. The config is loaded, validated
// for a world of 8 and written back as TOML (what checkpoints record), which is loaded again.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = input.find('\0');
  const std::string toml(input.substr(0, cut));
  std::vector<std::string> args;
  for (std::size_t at = cut; at != std::string_view::npos && at < input.size();) {
    const std::size_t next = input.find('\0', at + 1);
    args.emplace_back(input.substr(at + 1, next == std::string_view::npos ? next : next - at - 1));
    at = next;
  }
  meshtrain::fuzz::refuse_cleanly([&] {
    const meshtrain::Config config =
        meshtrain::load_config_text(toml, "fuzz.toml", meshtrain::parse_overrides(args));
    meshtrain::check_config(config, 8);
    meshtrain::load_config_text(meshtrain::to_toml(config), "fuzz.toml (written back)");
  });
  return 0;
}
