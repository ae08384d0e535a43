// The machine's AMX-BF16 peak: TDPBF16PS issued back to back on tiles that
// never leave the registers, on every OpenMP thread. No memory traffic, no
// packing, no softmax: the unit's own rate, the ceiling a bf16 kernel built on
// AMX tiles is compared against (a GEMM library's rate, bf16_gemm_peak.h,
// already includes its own loads and packing, so a kernel can beat it).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "timing.h"

namespace attend::bench {

// One TDPBF16PS with every tile at its full 16 rows x 64 bytes: a 16 x 16 f32
// block += (16 x 32 bf16) . (32 x 16 bf16), 16*16*32 multiply-adds.
inline constexpr double kAmxFlopsPerTdp = 2.0 * 16 * 16 * 32;

struct AmxPeak {
  int threads = 0;         // OpenMP threads that ran the loop
  std::int64_t trips = 0;  // loop trips per thread per call, 4 TDPBF16PS each
  double best_s = 0.0;     // fastest call
  double gflops = 0.0;     // threads * trips * 4 * kAmxFlopsPerTdp / best_s / 1e9; 0 when not measured
  int reps = 0;            // timed calls
  std::string missing;     // why there is no figure (empty when measured)
  bool measured() const { return gflops > 0.0; }
};

// At most this many trips: every accumulator then ends at <= 64*trips <= 2^24,
// an integer f32 holds exactly, so the result can be checked for equality.
inline constexpr std::int64_t kAmxMaxTrips = std::int64_t{1} << 18;

// Times the register-only TDPBF16PS loop on omp_get_max_threads() threads,
// best of at least 5 calls, after checking that every thread's accumulators
// hold the exact sums (a tile configuration that the instructions ignored
// would otherwise report an impossible rate). Where the CPU or the OS does not
// allow AMX-BF16 tiles (attend::cpu::supports), or the sums are wrong, returns
// gflops 0 with `missing` saying why. Throws attend::Error(invalid_argument)
// naming amx_peak_trips when trips is outside [1, kAmxMaxTrips].
AmxPeak measure_amx_peak(std::int64_t trips = kAmxMaxTrips, const TimingOptions& options = {});

// gflops / peak.gflops: a bf16 row's share of the AMX peak; NaN when the
// peak was not measured.
inline double ratio_to_amx_peak(double gflops, const AmxPeak& peak) {
  return peak.measured() ? gflops / peak.gflops : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace attend::bench
