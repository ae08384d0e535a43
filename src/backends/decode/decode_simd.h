// Decode-only vector helpers on top of flash's Simd wrappers (cpu/simd_*.h):
// the horizontal sums of a score tile. Included, like cpu/half_simd.h, inside
// an ISA TU's target region after its simd_*.h; every function is a template
// on the Simd type, so each ISA compiles its own copy and no wide instruction
// can leak into a narrower kernel family.
#pragma once

#include <cstdint>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace attend::decode::simd {

// Lane i of the result is the sum of the lanes of x[i]: a transpose-and-add
// tree (log2 W rounds) instead of W horizontal sums, which would each spend
// log2 W shuffle/add pairs on a single score. The order of the additions is
// fixed, so the result does not depend on where a tile sits in a block.
// Always inlined (as the tile stores below): called out of line, its array
// argument forces the tile's accumulators through memory (14 % of a decode
// step on f16 and 8-bit caches, where the kernels grew past GCC's inlining).
template <class S>
[[gnu::always_inline]] inline typename S::V sum_lanes(const typename S::V* x) {
#if defined(__x86_64__)
  if constexpr (S::W == 16) {
    __m512 t[8];
    for (int i = 0; i < 8; ++i) {
      // Per 128-bit chunk: [a0+a2, b0+b2, a1+a3, b1+b3].
      t[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]), _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
    }
    __m512 u[4];
    for (int i = 0; i < 4; ++i) {
      // Per 128-bit chunk c: the chunk-c sums of x[4i .. 4i+3] (pairs of floats
      // moved as doubles, added as floats).
      const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
      u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    // Across the chunks: [u0 c0+c1, u0 c2+c3, u1 c0+c1, u1 c2+c3], then whole sums.
    constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
    const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], kEven), _mm512_shuffle_f32x4(u[0], u[1], kOdd));
    const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], kEven), _mm512_shuffle_f32x4(u[2], u[3], kOdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, kEven), _mm512_shuffle_f32x4(v01, v23, kOdd));
  } else if constexpr (S::W == 8) {
    __m256 t[4];
    for (int i = 0; i < 4; ++i) {
      t[i] = _mm256_add_ps(_mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]), _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]));
    }
    __m256 u[2];
    for (int i = 0; i < 2; ++i) {
      const __m256d a = _mm256_castps_pd(t[2 * i]), b = _mm256_castps_pd(t[2 * i + 1]);
      u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
  } else
#endif
  {
    static_assert(S::W == 1 || S::W == 8 || S::W == 16);
    return x[0];
  }
}

// dst[0, KB) = lanes [r * KB, (r + 1) * KB) of v, straight from the register.
template <class S, int KB, int r>
[[gnu::always_inline]] inline void store_lanes(float* dst, typename S::V v) {
  static_assert(KB * (r + 1) <= S::W);
#if defined(__x86_64__)
  if constexpr (S::W == KB) {
    S::store(dst, v);
  } else if constexpr (S::W == 16 && KB == 8) {
    _mm256_storeu_ps(dst, _mm512_extractf32x8_ps(v, r));
  } else if constexpr (S::W == 16 && KB == 4) {
    _mm_storeu_ps(dst, _mm512_extractf32x4_ps(v, r));
  } else if constexpr (S::W == 8 && KB == 4) {
    _mm_storeu_ps(dst, _mm256_extractf128_ps(v, r));
  } else if constexpr (S::W == 8 && KB == 2) {
    const __m128 h = _mm256_extractf128_ps(v, r / 2);
    if constexpr (r % 2 == 0) {
      _mm_storel_pi(reinterpret_cast<__m64*>(dst), h);
    } else {
      _mm_storeh_pi(reinterpret_cast<__m64*>(dst), h);
    }
  } else
#endif
  {
    static_assert(S::W == KB, "no lane store for this tile shape");
    S::store(dst, v);
  }
}

// Row r of an R x KB tile of sums (lane r * KB + c of v) to s[r * ld + c], for r < rows.
template <class S, int KB, int R>
[[gnu::always_inline]] inline void store_tile(float* s, std::int64_t ld, typename S::V v) {
  [&]<int... r>(std::integer_sequence<int, r...>) [[gnu::always_inline]] {
    (store_lanes<S, KB, r>(s + r * ld, v), ...);
  }
  (std::make_integer_sequence<int, R>{});
}

}  // namespace attend::decode::simd
