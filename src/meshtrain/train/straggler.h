// src/meshtrain/train/straggler.h
//
// The straggler report (issue 6, item 7; seed 002's "one slow rank"): every rank times its
// step in phases — reading data, forward, backward, optimizer (compute only: the seconds spent
// inside collectives during a phase are taken out) and waiting in collectives — and every
// training.straggler_interval steps the ranks all-gather their sums. A rank whose compute
// phase exceeds that phase's median over the other ranks by more than threshold × the median
// step time is named with the phase. Why subtract the collectives: a slow rank makes its peers
// wait inside the next collective, so their forward or backward wall time grows too; their
// compute does not. Why the step time in the rule: a tiny phase (data, 0.1 ms) doubling is
// noise, not a straggler. Why the other ranks' median: with two ranks the plain median lies
// halfway between the slow rank and its peer.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace meshtrain {

enum class Phase : std::uint8_t { data, forward, backward, optimizer, comm_wait };
inline constexpr std::size_t kNumPhases = 5;
std::string_view to_string(Phase phase);

/// Seconds per phase on one rank, summed over a window of steps.
struct PhaseSeconds {
  std::array<double, kNumPhases> s{};
  double& operator[](Phase p) { return s[static_cast<std::size_t>(p)]; }
  double operator[](Phase p) const { return s[static_cast<std::size_t>(p)]; }
  /// Every phase together (compute phases plus the wait): the rank's step time.
  double total() const;
};

struct Straggler {
  int rank = 0;  // world rank
  Phase phase = Phase::data;
  double seconds = 0.0;  // this rank's time in the phase per step (s)
  double median = 0.0;   // the median of the other ranks' times in the phase per step (s)
};

/// Ranks whose compute phase (data, forward, backward, optimizer) exceeds the median of the
/// other ranks' (`per_rank` is indexed by world rank; sums over `steps` steps) by more than
/// threshold × (median step time), each with its slowest such phase; sorted by rank. Pure.
std::vector<Straggler> find_stragglers(const std::vector<PhaseSeconds>& per_rank,
                                       std::int64_t steps, double threshold);

/// Accumulates wall seconds of a phase minus the collective seconds spent inside it.
class PhaseClock {
 public:
  PhaseClock() = default;
  /// `comm_seconds`: this rank's seconds inside collectives so far, over all its groups.
  explicit PhaseClock(std::function<double()> comm_seconds) : comm_(std::move(comm_seconds)) {}

  /// Runs `fn`, adding its wall time minus the collective time inside it to into[phase].
  template <typename Fn>
  auto time(Phase phase, PhaseSeconds& into, Fn&& fn) {
    struct Done {
      const PhaseClock& clock;
      Phase phase;
      PhaseSeconds& into;
      std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
      double comm0 = clock.comm_ ? clock.comm_() : 0.0;
      ~Done() {
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        into[phase] += wall - (clock.comm_ ? clock.comm_() - comm0 : 0.0);
      }
    } done{*this, phase, into};
    return fn();
  }

 private:
  std::function<double()> comm_;
};

}  // namespace meshtrain
