// AVX2 + FMA: 8 floats per register. Compiled only inside a TU section that
// enables the avx2/fma target (see isa_avx2.cpp).
#pragma once

#include <immintrin.h>

#include "cpu/simd_exp.h"

namespace attend::cpu {

struct SimdAvx2 {
  using V = __m256;
  static constexpr int W = 8;
  static constexpr const char* name = "avx2";

  // Before calling baseline (SSE-encoded) code from kernel code (finish_rows).
  static void clean_upper() { _mm256_zeroupper(); }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  // One lane of fmadd: sums formed element by element round exactly as a GEMM lane does.
  static float fmadd1(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
  }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  // r[i][j] <- r[j][i] for an 8 x 8 block (see simd_avx512.h): pairs and 4 x 4
  // blocks within 128-bit lanes, then the lanes.
  static void transpose(V (&r)[W]) {
    V t[W];
    for (int i = 0; i < W; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < W; i += 4) {
      r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
      r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int k = 0; k < 4; ++k) {
      t[k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x20);
      t[4 + k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x31);
    }
    for (int i = 0; i < W; ++i) r[i] = t[i];
  }
  static float reduce_add(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static V exp(V x) {
    // exp(x) = 2^n * p(f), x*log2(e) = n + f, f in [-0.5, 0.5].
    // NaN-preserving clamps (x second: vmaxps/vminps return it when unordered).
    const V t = _mm256_max_ps(set1(-126.0f), _mm256_mul_ps(x, set1(kLog2e)));
    const V n = _mm256_round_ps(_mm256_min_ps(set1(127.0f), t), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = _mm256_sub_ps(t, n);
    V p = set1(kExp2C[kExp2Degree]);
    for (int i = kExp2Degree - 1; i >= 0; --i) p = _mm256_fmadd_ps(p, f, set1(kExp2C[i]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const V r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    // Below the clamp the true value is < 2^-126: flush to an exact 0 (masked = -inf);
    // NaN lanes pass (unordered compare true).
    return _mm256_and_ps(r, _mm256_cmp_ps(x, set1(kExpUnderflow), _CMP_NLT_UQ));
  }
  // 1 - tanh(x)^2 = u (2 - u) with u = 1 - |tanh x| = 2 / (exp(2|x|) + 1):
  // near the softcap (|tanh| -> 1) the textbook 1 - t*t subtracts two nearly
  // equal numbers and keeps only the rounding of t; u carries full precision.
  static V sech2(V x) {
    const V e = exp(_mm256_mul_ps(_mm256_andnot_ps(set1(-0.0f), x), set1(2.0f)));
    const V u = _mm256_div_ps(set1(2.0f), _mm256_add_ps(e, set1(1.0f)));
    return _mm256_mul_ps(u, _mm256_sub_ps(set1(2.0f), u));
  }
  static V tanh(V x) {
    // tanh|x| = 1 - 2 / (exp(2|x|) + 1); sign restored from x.
    const V sign = _mm256_and_ps(x, set1(-0.0f));
    const V ax = _mm256_andnot_ps(set1(-0.0f), x);
    const V e = exp(_mm256_mul_ps(ax, set1(2.0f)));
    const V t = _mm256_sub_ps(set1(1.0f), _mm256_div_ps(set1(2.0f), _mm256_add_ps(e, set1(1.0f))));
    const V far = _mm256_or_ps(t, sign);
    // Near 0 the series (see simd_exp.h), which keeps the sign by itself.
    const V x2 = _mm256_mul_ps(x, x);
    V p = set1(kTanhSeries[kTanhSeriesTerms - 1]);
    for (int i = kTanhSeriesTerms - 2; i >= 0; --i) p = _mm256_fmadd_ps(p, x2, set1(kTanhSeries[i]));
    const V near = _mm256_fmadd_ps(_mm256_mul_ps(x, x2), p, x);
    return _mm256_blendv_ps(far, near, _mm256_cmp_ps(ax, set1(kTanhSeriesBound), _CMP_LT_OQ));
  }
};

}  // namespace attend::cpu
