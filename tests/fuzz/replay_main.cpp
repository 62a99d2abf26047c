// tests/fuzz/replay_main.cpp
//
// The replay runner of the normal (GCC) build: feeds every file of the directories given on
// the command line (those that exist) to the target's LLVMFuzzerTestOneInput, once, in name
// order, so CTest replays the seed corpus and every regression input without a fuzzing engine. A
// finding ends the process as under libFuzzer (crash, abort, uncaught exception); the last
// "replay:" line names the input.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!fs::is_directory(argv[i])) {  // a target without regression inputs yet
      std::fprintf(stderr, "replay: no directory %s, skipped\n", argv[i]);
      continue;
    }
    for (const fs::directory_entry& e : fs::directory_iterator(argv[i])) {
      if (e.is_regular_file()) inputs.push_back(e.path());
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {  // a wrong path must not pass as "nothing failed"
    std::fprintf(stderr, "replay: no input files\n");
    return 2;
  }
  for (const fs::path& path : inputs) {
    std::fprintf(stderr, "replay: %s\n", path.c_str());
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in),
                                  std::istreambuf_iterator<char>()};
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "replay: %zu inputs, no finding\n", inputs.size());
  return 0;
}
