// src/meshtrain/train/collective_verdict.h
//
// Failures that only some ranks see (a file rank 0 writes, a checkpoint shard one rank reads)
// must stop every rank, or the others wait forever in their next collective. These helpers
// turn a rank-local outcome into one every rank of the group acts on.
#pragma once

#include <exception>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

/// Runs `check` on rank 0 of `group` only and broadcasts its verdict: every rank throws (rank
/// 0 its own ConfigError or DataError, the others one of the same type saying so) or none
/// does. Collective over `group`.
template <typename Check>
void on_rank0_for_all(ProcessGroup& group, Check&& check) {
  std::int32_t verdict = 0;  // 0 ok, 2 ConfigError, 3 DataError
  std::exception_ptr error;
  if (group.rank() == 0) {
    try {
      check();
    } catch (const ConfigError&) {
      verdict = 2;
      error = std::current_exception();
    } catch (const DataError&) {
      verdict = 3;
      error = std::current_exception();
    }
  }
  group.broadcast(std::as_writable_bytes(std::span<std::int32_t>(&verdict, 1)), 0);
  if (error) std::rethrow_exception(error);
  if (verdict == 2) throw ConfigError("rank 0", {});
  if (verdict == 3) throw DataError("rank 0 could not write its output files (see its message)");
}

/// True on every rank of `group` when `local` is true on any of them. Collective over `group`
/// (one all-reduce of 4 bytes).
bool on_any_rank(ProcessGroup& group, bool local);

/// `local_error` is this rank's failure ("" = none). Returns "" on every rank when no rank
/// failed; otherwise every rank gets the message of the lowest failing rank, prefixed with
/// "rank R: ". Collective over `group` (one all-reduce, plus one broadcast on failure).
std::string first_error(ProcessGroup& group, const std::string& local_error);

/// The environment's on/off switches (core/env_switch.h), checked on every rank and agreed:
/// `mpirun -x` can give each rank its own value, and a rank that stopped alone would leave
/// the others waiting in their next collective. A bad value on any rank makes every rank
/// throw the same ConfigError (source "the environment"), naming the lowest such rank and
/// its value. Collective over `group` (one all-reduce, plus one broadcast on failure).
void check_environment_for_all(ProcessGroup& group);

/// One rank's part of reports_of_highest().
struct RankReport {
  int rank = 0;  // world rank
  std::string text;
};
struct HighestReports {
  int priority = 0;                 // the highest priority any rank gave; 0 = nothing to report
  int count = 0;                    // ranks that gave it
  std::vector<RankReport> reports;  // the lowest `limit` of them, lowest rank first
};
/// Every rank says how much its `text` matters (`priority`; ≤ 0: nothing to report); every rank
/// learns the texts of the ranks with the highest priority. For findings several ranks may
/// make at once (where a non-finite value first appeared). Collective over `group`: one
/// all-gather of one value per rank, plus two broadcasts per report returned.
HighestReports reports_of_highest(ProcessGroup& group, int priority, const std::string& text,
                                  int limit);

/// Runs `check` on every rank of `group`; when it throws a DataError on some, every rank throws
/// a DataError with the lowest failing rank's message (first_error). Collective over `group`.
template <typename Check>
void agree_on_data_errors(ProcessGroup& group, Check&& check) {
  std::string message;
  try {
    check();
  } catch (const DataError& e) {
    message = e.what();
  }
  if (std::string first = first_error(group, message); !first.empty()) throw DataError(first);
}

}  // namespace meshtrain
