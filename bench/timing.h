// Wall-clock timing of a callable: repeated until both a minimum total time and
// a minimum number of repetitions are reached, after untimed warm-up calls (the
// first call pays for page faults on freshly allocated outputs and for thread
// pool start-up, which a steady-state rate must not include).
#pragma once

#include <functional>

namespace attend::bench {

struct TimingOptions {
  double min_time = 0.5;  // seconds of timed calls, at least
  int min_reps = 3;       // timed calls, at least
  int max_reps = 1000;    // timed calls, at most (tiny problems stop here)
  int warmup = 1;         // untimed calls before the first timed one
};

struct Timing {
  double best_s = 0.0;    // fastest timed call
  double median_s = 0.0;  // median of the timed calls (mean of the middle two when even)
  int reps = 0;           // timed calls
};

// Runs fn() warmup times, then times it until reps >= min_reps and the timed
// total >= min_time (or reps == max_reps). Exceptions from fn() propagate.
Timing time_it(const std::function<void()>& fn, const TimingOptions& options = {});

}  // namespace attend::bench
