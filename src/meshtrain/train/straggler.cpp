#include "meshtrain/train/straggler.h"

#include <algorithm>
#include <numeric>

namespace meshtrain {
namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::data:
      return "data";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::optimizer:
      return "optimizer";
    case Phase::comm_wait:
      return "comm_wait";
  }
  return "unknown";
}

double PhaseSeconds::total() const { return std::accumulate(s.begin(), s.end(), 0.0); }

std::vector<Straggler> find_stragglers(const std::vector<PhaseSeconds>& per_rank,
                                       std::int64_t steps, double threshold) {
  std::vector<Straggler> out;
  if (per_rank.size() < 2 || steps < 1) return out;
  const double n = static_cast<double>(steps);
  std::vector<double> totals;
  for (const PhaseSeconds& r : per_rank) totals.push_back(r.total() / n);
  const double margin = threshold * median_of(totals);
  for (const Phase phase : {Phase::data, Phase::forward, Phase::backward, Phase::optimizer}) {
    std::vector<double> times;
    for (const PhaseSeconds& r : per_rank) times.push_back(r[phase] / n);
    for (std::size_t rank = 0; rank < per_rank.size(); ++rank) {
      // The median of the OTHER ranks: with two ranks the plain median would sit halfway
      // between the slow one and its peer and hide half the lag.
      std::vector<double> others = times;
      others.erase(others.begin() + static_cast<std::ptrdiff_t>(rank));
      const double median = median_of(others);
      const double excess = times[rank] - median;
      if (excess <= margin) continue;
      const auto mine = std::find_if(out.begin(), out.end(), [&](const Straggler& s) {
        return s.rank == static_cast<int>(rank);
      });
      const Straggler s{static_cast<int>(rank), phase, times[rank], median};
      if (mine == out.end()) {
        out.push_back(s);
      } else if (excess > mine->seconds - mine->median) {
        *mine = s;  // name the phase where it lags most
      }
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Straggler& a, const Straggler& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace meshtrain
