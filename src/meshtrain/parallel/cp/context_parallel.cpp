#include "meshtrain/parallel/cp/context_parallel.h"

namespace meshtrain {

std::vector<std::int32_t> zigzag_rows(const std::vector<std::int32_t>& full, std::int64_t sequences,
                                      std::int64_t seq_len, int cp_rank, int cp_size) {
  if (cp_size == 1) return full;
  const std::int64_t local = seq_len / cp_size;
  std::vector<std::int32_t> out(static_cast<std::size_t>(sequences * local));
  for (std::int64_t b = 0; b < sequences; ++b) {
    for (std::int64_t i = 0; i < local; ++i) {
      out[static_cast<std::size_t>(b * local + i)] =
          full[static_cast<std::size_t>(b * seq_len + zigzag_position(i, local, cp_rank, cp_size))];
    }
  }
  return out;
}

}  // namespace meshtrain
