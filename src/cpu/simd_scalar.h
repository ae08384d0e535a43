// Portable "vector" of one float: the fallback every x86-64 CPU (and any other)
// can run, and the semantic baseline for the wider ISAs.
#pragma once

#include <algorithm>
#include <cmath>

namespace attend::cpu {

struct SimdScalar {
  using V = float;
  static constexpr int W = 1;
  static constexpr const char* name = "scalar";

  // Before calling baseline (SSE-encoded) code from kernel code (finish_rows).
  static void clean_upper() {}
  static V zero() { return 0.0f; }
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V fmadd(V a, V b, V c) { return a * b + c; }
  static float fmadd1(float a, float b, float c) { return fmadd(a, b, c); }
  static V max(V a, V b) { return std::max(a, b); }
  // A 1 x 1 block is its own transpose (the kernels' packing loops call it per block).
  static void transpose(V (&)[W]) {}
  static float reduce_add(V v) { return v; }
  static float reduce_max(V v) { return v; }
  // exp(x) with exp(-inf) = 0 exactly (masked scores must vanish).
  static V exp(V x) { return std::exp(x); }
  static V tanh(V x) { return std::tanh(x); }
  // 1 - tanh(x)^2 without the cancellation of 1 - t*t near |t| = 1 (see simd_avx2.h).
  static V sech2(V x) {
    const V u = 2.0f / (std::exp(2.0f * std::abs(x)) + 1.0f);
    return u * (2.0f - u);
  }
};

}  // namespace attend::cpu
