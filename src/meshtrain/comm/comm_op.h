// src/meshtrain/comm/comm_op.h
//
// CommOp: the kinds of operation a ProcessGroup counts (its byte counters) and reports to its
// observers (comm_observer.h). The non-blocking ones count as their blocking twins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace meshtrain {

enum class CommOp : std::uint8_t {
  all_reduce,
  broadcast,
  barrier,
  reduce_scatter,
  all_gather,
  all_to_all,
  send,
  recv,
};
inline constexpr std::size_t kNumCommOps = 8;
std::string_view to_string(CommOp op);

}  // namespace meshtrain
