#include "meshtrain/core/file_name.h"

namespace meshtrain {

bool is_plain_file_name(std::string_view name) noexcept {
  // "\" too: a name written on Windows ("..\x") means a path there.
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos;
}

}  // namespace meshtrain
