#include "timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace attend::bench {

Timing time_it(const std::function<void()>& fn, const TimingOptions& options) {
  for (int i = 0; i < options.warmup; ++i) fn();
  const int min_reps = std::max(1, options.min_reps);
  const int max_reps = std::max(min_reps, options.max_reps);
  std::vector<double> times;
  double total = 0.0;
  while (static_cast<int>(times.size()) < min_reps ||
         (total < options.min_time && static_cast<int>(times.size()) < max_reps)) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count();
    times.push_back(s);
    total += s;
  }
  std::sort(times.begin(), times.end());
  Timing t;
  t.reps = static_cast<int>(times.size());
  t.best_s = times.front();
  const std::size_t mid = times.size() / 2;
  t.median_s = times.size() % 2 ? times[mid] : 0.5 * (times[mid - 1] + times[mid]);
  return t;
}

}  // namespace attend::bench
