// Tiling of the flash kernels per ISA (FlashAttention's kernel_traits idea).
//   block_m: query rows per tile   block_n: keys per tile
//   mr x nv: register micro-tile of the GEMMs (mr rows, nv vectors of W floats)
#pragma once

#include <cstdint>

namespace attend::flash {

template <class Simd>
struct KernelTraits;

struct SimdScalar;
struct SimdAvx2;
struct SimdAvx512;

template <>
struct KernelTraits<SimdScalar> {
  static constexpr std::int64_t block_m = 32, block_n = 32;
  static constexpr int mr = 4, nv = 4;
};

// 16 ymm registers: 6 x 2 accumulators + 2 B vectors + 1 broadcast.
template <>
struct KernelTraits<SimdAvx2> {
  static constexpr std::int64_t block_m = 64, block_n = 64;
  static constexpr int mr = 6, nv = 2;
};

// 32 zmm registers: 8 x 2 accumulators leaves room for B loads and broadcasts;
// block_n = 64 keeps the S/P tile and packed K/V inside L2 at head_dim 256.
template <>
struct KernelTraits<SimdAvx512> {
  static constexpr std::int64_t block_m = 64, block_n = 64;
  static constexpr int mr = 8, nv = 2;
};

constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// Floats of per-thread scratch the forward / backward tile loops use.
template <class Simd>
constexpr std::int64_t forward_scratch_floats(std::int64_t dqk, std::int64_t dv) {
  using T = KernelTraits<Simd>;
  const std::int64_t dvp = round_up(dv, Simd::W);
  return T::block_m * dqk          // Qs
         + dqk * T::block_n        // Kt
         + T::block_n * dvp        // Vs
         + T::block_m * T::block_n // S / P
         + T::block_m * dvp        // O accumulator
         + 2 * T::block_m          // running max, running sum
         + 64;                     // alignment slack
}

template <class Simd>
constexpr std::int64_t backward_scratch_floats(std::int64_t dqk, std::int64_t dv) {
  using T = KernelTraits<Simd>;
  const std::int64_t dqp = round_up(dqk, Simd::W), dvp = round_up(dv, Simd::W);
  return dqk * T::block_n          // Kt
         + T::block_n * dqp        // Ks
         + dv * T::block_n         // Vt
         + T::block_n * dqp        // dK accumulator
         + T::block_n * dvp        // dV accumulator
         + T::block_m * dqp        // Qs
         + T::block_m * dvp        // dOs
         + 2 * T::block_m * T::block_n  // P, dP
         + T::block_n * T::block_m      // transposed P' / dS
         + T::block_m * dqp        // dQ tile
         + 3 * T::block_m          // D, LSE, softcap flag scratch
         + 64;
}

}  // namespace attend::flash
