// Tiling of the flash kernels per ISA (FlashAttention's kernel_traits idea).
//   fwd_m: query rows per forward task     fwd_n: keys per forward tile
//   bwd_m: query rows per backward tile    bwd_n: keys per backward task step
//   mr x nv: register micro-tile of the GEMMs (mr rows, nv vectors of W floats)
#pragma once

#include <cstdint>

namespace attend::cpu {
struct SimdScalar;
struct SimdAvx2;
struct SimdAvx512;
}  // namespace attend::cpu

namespace attend::flash {

// The vector types are the CPU support's (src/cpu/simd_*.h), shared with decode.
using cpu::SimdAvx2;
using cpu::SimdAvx512;
using cpu::SimdScalar;

template <class Simd>
struct KernelTraits;

template <>
struct KernelTraits<SimdScalar> {
  static constexpr std::int64_t fwd_m = 32, fwd_n = 32, bwd_m = 32, bwd_n = 32;
  static constexpr int mr = 4, nv = 4;
};

// 16 ymm registers: 6 x 2 accumulators + 2 B vectors + 1 broadcast.
template <>
struct KernelTraits<SimdAvx2> {
  static constexpr std::int64_t fwd_m = 128, fwd_n = 64, bwd_m = 64, bwd_n = 128;
  static constexpr int mr = 6, nv = 2;
};

// 32 zmm registers: 8 x 2 accumulators leave room for B loads and broadcasts.
// Forward: 256 queries share each K/V block copy; 128-key blocks halve the
// rescaling of the output accumulator against 64 (1-4 % faster in 15 of 16
// shapes: D = 64/128, S = 512/4096, causal or not, f32/bf16).
// Backward: 256 keys share each sweep over the query rows, whose Q/dO copies,
// dO . O dots and dQ read-modify-writes miss the cache (rows H*D apart, read
// again per key block): at 128 keys perf put them at ~18 % of the time, and
// 256 made the backward 10 % faster (S = 4096, D = 128; D = 64 and 256 3-8 %;
// bf16 12-18 %) for 0.9 MiB of tiles per thread at D = 128 (1.6 MiB at 256:
// past a 1 MiB L2, and still faster). 512 was within the noise of 256 at
// D = 64 and 256. The AVX2 family keeps 128: its 6-row micro-tile makes
// diagonal tiles costly, and at 256 its causal S = 512 backward lost 6-9 %.
template <>
struct KernelTraits<SimdAvx512> {
  static constexpr std::int64_t fwd_m = 256, fwd_n = 128, bwd_m = 64, bwd_n = 256;
  static constexpr int mr = 8, nv = 2;
};

constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// Floats of per-thread scratch the forward / backward tile loops use.
template <class Simd>
constexpr std::int64_t forward_scratch_floats(std::int64_t dqk, std::int64_t dv) {
  using T = KernelTraits<Simd>;
  const std::int64_t dvp = round_up(dv, Simd::W);
  return dqk * T::fwd_m         // Qt: scale * Q^T
         + T::fwd_n * dqk       // K block
         + T::fwd_n * dvp       // V block
         + T::fwd_n * T::fwd_m  // S^T / P^T
         + T::fwd_m * dvp       // O accumulator
         + 4 * T::fwd_m         // running max, running sum, rescale factors, scratch
         + T::fwd_m * dvp       // level-2 O accumulator (forward_impl.h, fold_blocks)
         + 2 * T::fwd_m         // level-2 row sums, their pending rescale
         + 64;                  // alignment slack
}

template <class Simd>
constexpr std::int64_t backward_scratch_floats(std::int64_t dqk, std::int64_t dv) {
  using T = KernelTraits<Simd>;
  const std::int64_t dqp = round_up(dqk, Simd::W), dvp = round_up(dv, Simd::W);
  return dqk * T::bwd_n             // Kt: scale * K^T
         + dv * T::bwd_n            // Vt
         + T::bwd_n * dqp           // K block
         + T::bwd_n * dqp           // dK accumulator
         + T::bwd_n * dvp           // dV accumulator
         + T::bwd_m * dqp           // Q block
         + T::bwd_m * dvp           // dO block
         + 3 * T::bwd_m * T::bwd_n  // P, dS, 1 - tanh^2 (softcap)
         + T::bwd_m * dqp           // dQ tile
         + 2 * T::bwd_m             // D, LSE
         + 64;
}

}  // namespace attend::flash
