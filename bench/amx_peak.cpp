#include "amx_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attend/error.h"
#include "cpu/isa.h"
#include "cpu/target_region.h"

namespace attend::bench {

namespace {

// The operand tiles' values, distinct so that a tile mix-up shows in the sums:
// A0 = 1, A1 = 2, B0 = 1, B1 = 0.5 (bf16 words). An accumulator element gains
// 32 products a trip: C0 = A0.B0 +32, C1 = A0.B1 +16, C2 = A1.B0 +64, C3 = A1.B1 +32.
constexpr std::uint16_t kBf16One = 0x3f80, kBf16Two = 0x4000, kBf16Half = 0x3f00;
constexpr float kGainPerTrip[4] = {32.0f, 16.0f, 64.0f, 32.0f};

constexpr int kTileElems = 16 * 32;  // bf16 in a 16-row, 64-byte tile

struct alignas(64) Operands {
  std::uint16_t a0[kTileElems], a1[kTileElems], b0[kTileElems], b1[kTileElems];
};

// One thread's four 16 x 16 f32 accumulators after its last call.
struct alignas(64) Accumulators {
  float c[4][16 * 16] = {};
};

}  // namespace

// Only this function is built for AMX, and it runs only where
// cpu::supports(avx512amx) granted the process the tile state.
}  // namespace attend::bench

// The tile unit is the kernels' own (cpu/amx_tiles.h), hardware only; it is
// defined inside the region, so it is included here, at namespace scope.
ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX512_BF16_AMX)
#include "cpu/amx_tiles.h"
namespace attend::bench {
namespace {

__attribute__((noinline)) void tdp_loop(std::int64_t trips, const Operands& in, Accumulators& out) {
  using T = cpu::AmxTiles;
  T::configure();
  T::load<4>(in.a0, 64);
  T::load<5>(in.a1, 64);
  T::load<6>(in.b0, 64);
  T::load<7>(in.b1, 64);
  T::zero<0>();
  T::zero<1>();
  T::zero<2>();
  T::zero<3>();
  // Four independent accumulators cover TDPBF16PS's latency (about 4x its
  // issue interval on Sapphire Rapids), so the loop runs at the issue rate.
  for (std::int64_t i = 0; i < trips; ++i) {
    T::dpbf16ps<0, 4, 6>();
    T::dpbf16ps<1, 4, 7>();
    T::dpbf16ps<2, 5, 6>();
    T::dpbf16ps<3, 5, 7>();
  }
  T::store<0>(out.c[0], 64);
  T::store<1>(out.c[1], 64);
  T::store<2>(out.c[2], 64);
  T::store<3>(out.c[3], 64);
  // Hands the tile state back, so the thread's later context switches and
  // other kernels do not carry it.
  T::release();
}

}  // namespace
}  // namespace attend::bench
ATTEND_TARGET_REGION_END()

namespace attend::bench {

AmxPeak measure_amx_peak(std::int64_t trips, const TimingOptions& options) {
  if (trips < 1 || trips > kAmxMaxTrips) {
    throw Error(ErrorCode::invalid_argument, "amx_peak_trips", std::to_string(trips),
                "must be in [1, " + std::to_string(kAmxMaxTrips) + "]");
  }
  AmxPeak peak;
  peak.trips = trips;
  // First: on Linux this asks the kernel for the tile state (arch_prctl); a
  // tile instruction before that grant is a fault.
  if (!cpu::supports(cpu::Isa::avx512amx)) {
    peak.missing = std::string(cpu::missing(cpu::Isa::avx512amx));
    return peak;
  }
  Operands in;
  std::fill(std::begin(in.a0), std::end(in.a0), kBf16One);
  std::fill(std::begin(in.a1), std::end(in.a1), kBf16Two);
  std::fill(std::begin(in.b0), std::end(in.b0), kBf16One);
  std::fill(std::begin(in.b1), std::end(in.b1), kBf16Half);
  const int threads = omp_get_max_threads();
  std::vector<Accumulators> acc(static_cast<std::size_t>(threads));
  int team = 0;
  TimingOptions t = options;
  t.min_reps = std::max(t.min_reps, 5);
  const Timing timing = time_it(
      [&] {
#pragma omp parallel num_threads(threads)
        {
          if (omp_get_thread_num() == 0) team = omp_get_num_threads();
          tdp_loop(trips, in, acc[static_cast<std::size_t>(omp_get_thread_num())]);
        }
      },
      t);
  for (int th = 0; th < team; ++th) {
    for (int tile = 0; tile < 4; ++tile) {
      const float want = kGainPerTrip[tile] * static_cast<float>(trips);
      for (const float got : acc[static_cast<std::size_t>(th)].c[tile]) {
        if (got != want) {
          peak.missing = "TDPBF16PS left accumulator " + std::to_string(tile) + " of thread " + std::to_string(th) +
                         " at " + std::to_string(got) + ", expected " + std::to_string(want) + ": not measured";
          return peak;
        }
      }
    }
  }
  peak.threads = team;
  peak.best_s = timing.best_s;
  peak.reps = timing.reps;
  peak.gflops = static_cast<double>(team) * static_cast<double>(trips) * 4.0 * kAmxFlopsPerTdp / timing.best_s / 1e9;
  return peak;
}

}  // namespace attend::bench
