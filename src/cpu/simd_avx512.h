// AVX-512F: 16 floats per register. Compiled only inside a TU section that
// enables the avx512 target (see isa_avx512.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/simd_exp.h"

namespace attend::cpu {

struct SimdAvx512 {
  using V = __m512;
  static constexpr int W = 16;
  static constexpr const char* name = "avx512";

  // Before calling baseline (SSE-encoded) code from kernel code (finish_rows).
  static void clean_upper() { _mm256_zeroupper(); }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // One lane of fmadd: sums formed element by element round exactly as a GEMM lane does.
  static float fmadd1(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
  }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  // r[i][j] <- r[j][i] for a 16 x 16 block: a strided gather of 256 elements
  // becomes 16 loads, 64 shuffles and 16 stores. Pairs within 128-bit lanes,
  // then 4 x 4 blocks within lanes, then the lanes themselves.
  static void transpose(V (&r)[W]) {
    V t[W];
    for (int i = 0; i < W; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < W; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    // Lane l of r[4g + k] now holds rows 4g..4g+3 of column 4l + k.
    for (int k = 0; k < 4; ++k) {
      t[k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
      t[4 + k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xdd);
      t[8 + k] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
      t[12 + k] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xdd);
    }
    for (int k = 0; k < 4; ++k) {
      r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
      r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd);
      r[4 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88);
      r[12 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xdd);
    }
  }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  static V exp(V x) {
    // exp(x) = 2^n * p(f) via scalef, which handles the exponent without integer tricks.
    // The clamps take x second (vmaxps/vminps return the second operand when
    // either is NaN) and the flush below keeps unordered lanes: exp(NaN) = NaN.
    const V t = _mm512_max_ps(set1(-126.0f), _mm512_mul_ps(x, set1(kLog2e)));
    const V n = _mm512_roundscale_ps(_mm512_min_ps(set1(127.0f), t), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = _mm512_sub_ps(t, n);
    V p = set1(kExp2C[kExp2Degree]);
    for (int i = kExp2Degree - 1; i >= 0; --i) p = _mm512_fmadd_ps(p, f, set1(kExp2C[i]));
    const V r = _mm512_scalef_ps(p, n);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, set1(kExpUnderflow), _CMP_NLT_UQ), r);
  }
  // 1 - tanh(x)^2 = u (2 - u) with u = 1 - |tanh x| = 2 / (exp(2|x|) + 1):
  // near the softcap (|tanh| -> 1) the textbook 1 - t*t subtracts two nearly
  // equal numbers and keeps only the rounding of t; u carries full precision.
  static V sech2(V x) {
    const V e = exp(_mm512_mul_ps(_mm512_abs_ps(x), set1(2.0f)));
    const V u = _mm512_div_ps(set1(2.0f), _mm512_add_ps(e, set1(1.0f)));
    return _mm512_mul_ps(u, _mm512_sub_ps(set1(2.0f), u));
  }
  static V tanh(V x) {
    const V ax = _mm512_abs_ps(x);
    const V e = exp(_mm512_mul_ps(ax, set1(2.0f)));
    const V t = _mm512_sub_ps(set1(1.0f), _mm512_div_ps(set1(2.0f), _mm512_add_ps(e, set1(1.0f))));
    // t >= 0: put x's sign bit on it.
    const __m512i sign = _mm512_and_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    const V far = _mm512_castsi512_ps(_mm512_or_epi32(_mm512_castps_si512(t), sign));
    // Near 0 the series (see simd_exp.h), which keeps the sign by itself.
    const V x2 = _mm512_mul_ps(x, x);
    V p = set1(kTanhSeries[kTanhSeriesTerms - 1]);
    for (int i = kTanhSeriesTerms - 2; i >= 0; --i) p = _mm512_fmadd_ps(p, x2, set1(kTanhSeries[i]));
    const V near = _mm512_fmadd_ps(_mm512_mul_ps(x, x2), p, x);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, set1(kTanhSeriesBound), _CMP_LT_OQ), far, near);
  }
};

}  // namespace attend::cpu
