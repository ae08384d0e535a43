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
#include <limits>
#include <type_traits>

#include "kernel/half.h"
#include "kernel/quant8.h"
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

// The 8-bit K/V codes (kernel/quant8.h), widened exactly: W bytes read.
//   i8   -> f32: sign-extend and convert.
//   e5m2 -> f32: the byte is an f16's upper half; vcvtph2ps.
//   e4m3 -> f32: its bits moved into an f16 (exponent 4 of 5 bits, mantissa 3
//   of 10) are 2^-8 times its value, subnormals included, so vcvtph2ps and a
//   multiply by 256 (exact) widen it; S.1111.111 is NaN.
template <class S>
inline typename S::V load_f32(const std::int8_t* p) {
#if defined(__x86_64__)
  if constexpr (S::W == 16) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else if constexpr (S::W == 8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else
#endif
  {
    static_assert(S::W == 1 || S::W == 8 || S::W == 16);
    return static_cast<float>(*p);
  }
}

template <class S>
inline typename S::V load_f32(const fp8_e5m2_t* p) {
#if defined(__x86_64__)
  if constexpr (S::W == 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
  } else if constexpr (S::W == 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(b), 8));
  } else
#endif
  {
    static_assert(S::W == 1 || S::W == 8 || S::W == 16);
    return static_cast<float>(*p);
  }
}

template <class S>
inline typename S::V load_f32(const fp8_e4m3_t* p) {
  // Sign-extended to 16 bits and shifted left by 7, a code's magnitude bits
  // land on an f16's bits 7..13 and its sign on bits 14 and 15: clearing bit
  // 14 leaves the f16 that is 2^-8 times the code's value (subnormals too).
  // A NaN code (magnitude 0x7f) is the f16 0x3f80 (times 256: 480) and is
  // put back to NaN by one compare.
#if defined(__x86_64__)
  if constexpr (S::W == 16) {
    const __m256i w = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7);
    const __m256i h = _mm256_and_si256(w, _mm256_set1_epi16(static_cast<short>(0xbf80)));
    const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    const __m512i mag = _mm512_cvtepu16_epi32(_mm256_and_si256(h, _mm256_set1_epi16(0x3f80)));
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x3f80));
    return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  } else if constexpr (S::W == 8) {
    const __m128i w = _mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 7);
    const __m128i h = _mm_and_si128(w, _mm_set1_epi16(static_cast<short>(0xbf80)));
    const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x3f80));
    const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x3f80))));
    return _mm256_blendv_ps(f, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), nan);
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
