// The machine's measured single-precision GEMM rate: the ceiling every
// attention implementation in the benchmark is compared against.
#pragma once

#include <cstdint>
#include <string>

#include "timing.h"

namespace attend::bench {

struct SgemmPeak {
  std::int64_t n = 0;    // C(n x n) = A(n x n) * B(n x n), row-major
  double best_s = 0.0;   // fastest call
  double gflops = 0.0;   // 2*n^3 / best_s / 1e9
  int reps = 0;
};

// Times cblas_sgemm on n x n x n (random data), best of the timed calls; at
// least 5 timed calls whatever options.min_reps says ("best of several").
SgemmPeak measure_sgemm_peak(std::int64_t n = 2048, const TimingOptions& options = {});

// openblas_get_config(): the OpenBLAS build and the kernel (core type) in use,
// which OPENBLAS_CORETYPE can override.
std::string blas_config();
// Threads OpenBLAS uses (openblas_get_num_threads()).
int blas_threads();

}  // namespace attend::bench
