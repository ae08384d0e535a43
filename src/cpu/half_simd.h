// Widening loads and narrowing stores between bf16/f16 (or f32) memory and a
// Simd vector of f32 (cpu::SimdScalar / SimdAvx2 / SimdAvx512). Included
// inside an ISA TU's target region after its simd_*.h, with kernel/half.h and
// <immintrin.h> included before the region. Everything here is a template on
// the Simd type, so each ISA gets its own instantiations: no inline function
// compiled for a wide ISA can be shared with (and leak into) a narrower one.
//   bf16 -> f32: zero-extend each 16-bit value and shift it into the upper half.
//   f16  -> f32: F16C's vcvtph2ps (exact; bit-identical to kernel/half.h).
//   f32 -> bf16/f16: the portable converters of kernel/half.h (round to nearest
//   even, NaN kept); stores are per row, so their cost is negligible.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernel/half.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace attend::detail {

template <class S>
inline typename S::V load_f32(const float* p) {
  return S::load(p);
}

template <class S>
inline typename S::V load_f32(const bf16_t* p) {
#if defined(__x86_64__)
  if constexpr (S::W == 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (S::W == 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else
#endif
  {
    static_assert(S::W == 1 || S::W == 8 || S::W == 16);
    return static_cast<float>(*p);
  }
}

template <class S>
inline typename S::V load_f32(const f16_t* p) {
#if defined(__x86_64__)
  if constexpr (S::W == 16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else if constexpr (S::W == 8) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else
#endif
  {
    static_assert(S::W == 1 || S::W == 8 || S::W == 16);
    return static_cast<float>(*p);
  }
}

// dst[0, n) = src[0, n) converted to E (n any count).
template <class S, class E>
inline void store_row(E* dst, const float* src, std::int64_t n) {
  if constexpr (std::is_same_v<E, float>) {
    std::int64_t d = 0;
    for (; d + S::W <= n; d += S::W) S::store(dst + d, S::load(src + d));
    for (; d < n; ++d) dst[d] = src[d];
  } else {
    for (std::int64_t d = 0; d < n; ++d) dst[d] = E(src[d]);
  }
}

}  // namespace attend::detail
