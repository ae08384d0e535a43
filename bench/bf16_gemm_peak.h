// The machine's measured bf16 GEMM rate: the ceiling the bf16 kernels are
// compared against (vdpbf16ps or AMX tiles run bf16 GEMMs at 2x to 10x the
// f32 FMA rate, so sgemm says little of how close a bf16 kernel comes to the
// hardware). Measured with oneDNN's matmul, the library PyTorch's CPU bf16
// GEMMs run on, so the figure is the one a PyTorch user sees for a GEMM.
#pragma once

#include <cstdint>
#include <string>

#include "timing.h"

namespace attend::bench {

struct Bf16GemmPeak {
  std::int64_t n = 0;   // C(n x n, f32) = A(n x n, bf16) * B(n x n, bf16), row-major
  double best_s = 0.0;  // fastest call
  double gflops = 0.0;  // 2*n^3 / best_s / 1e9; 0 when not measured
  int reps = 0;
  std::string impl;  // oneDNN's implementation (e.g. "brg:avx512_core_amx"), or why there is none
  bool measured() const { return gflops > 0.0; }
};

// Times oneDNN's bf16 matmul on n x n x n (random data), best of at least 5
// calls. Without oneDNN in the build, or on a CPU without a bf16 GEMM of its
// own (oneDNN then emulates one), returns gflops 0 with `impl` saying why.
Bf16GemmPeak measure_bf16_gemm_peak(std::int64_t n = 2048, const TimingOptions& options = {});

}  // namespace attend::bench
