// How many threads a CPU kernel may use: ATTEND_NUM_THREADS caps it, otherwise
// OpenMP decides (OMP_NUM_THREADS, or the number of cores).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "attend/error.h"

namespace attend::detail {

inline int thread_budget() {
  if (const char* env = std::getenv("ATTEND_NUM_THREADS"); env && *env) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (*end != '\0' || n < 1 || n > 4096) {
      throw Error(ErrorCode::invalid_argument, "ATTEND_NUM_THREADS", env, "expected an integer in [1, 4096]");
    }
    return static_cast<int>(n);
  }
  return std::max(1, omp_get_max_threads());
}

}  // namespace attend::detail
