// tests/reference/dump_main.h — the command line both dump programs share:
//   <program> <out> [--no-bias | --llama | --mixtral]
// selects the model variant ("gpt2", "gpt2-nobias", "llama" or, where the program offers it,
// "mixtral") and turns a usage error into exit 2 and an exception into exit 1, each with a
// message.
#pragma once

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

namespace meshtrain::test {

/// Calls run(out, variant) and returns its exit code. `mixtral`: --mixtral is offered.
template <typename Run>
int dump_main(int argc, char** argv, const char* program, const char* out_name, Run&& run,
              bool mixtral = false) {
  const std::string_view flag = argc == 3 ? argv[2] : "";
  const bool known = flag == "--no-bias" || flag == "--llama" || (mixtral && flag == "--mixtral");
  if (argc < 2 || argc > 3 || (argc == 3 && !known)) {
    std::fprintf(stderr, "usage: %s %s [--no-bias | --llama%s]\n", program, out_name,
                 mixtral ? " | --mixtral" : "");
    return 2;
  }
  try {
    const std::string variant = flag == "--llama"     ? "llama"
                                : flag == "--mixtral" ? "mixtral"
                                : flag == "--no-bias" ? "gpt2-nobias"
                                                      : "gpt2";
    return run(argv[1], variant);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace meshtrain::test
