// Register-blocked GEMM on bf16 pairs with AVX512-BF16's vdpbf16ps:
//   C[m x n] (= or +=) sum over pairs p of A(r, p) . B(p, cols)
// where each operand element is a 32-bit word holding two bf16 values of
// consecutive depth indices (2p, 2p + 1): vdpbf16ps multiplies the pairs
// exactly and adds both products to the f32 accumulator — twice the
// multiply-adds of an f32 FMA per instruction. A(r, p) = a[r * rs + p * ps]
// (one word, broadcast); B(p, cols) = b[p * ldb + col], 16 words per vector;
// C is f32, row-major. n must be a multiple of 16. Included inside the
// avx512bf16 target region of isa_avx512.cpp.
#pragma once

#include <cstdint>

namespace attend::flash::ATTEND_FLASH_ISA {

struct MatW {
  const std::uint32_t* a;
  std::int64_t rs, ps;  // word strides: row, pair
  MatW rows_from(std::int64_t r) const { return {a + r * rs, rs, ps}; }
};

template <int MR, int NV>
inline void dp_micro_kernel(std::int64_t kp, MatW a, const std::uint32_t* b, std::int64_t ldb, float* c,
                            std::int64_t ldc, bool accumulate) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + v * 16) : _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < kp; ++p) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * ldb + v * 16);
    const std::uint32_t* ap = a.a + p * a.ps;
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[r * a.rs]));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }
}

template <int MR, int NV>
inline void dp_row_panel(std::int64_t m, std::int64_t kp, MatW a, const std::uint32_t* b, std::int64_t ldb, float* c,
                         std::int64_t ldc, bool accumulate) {
  std::int64_t r = 0;
  for (; r + MR <= m; r += MR) dp_micro_kernel<MR, NV>(kp, a.rows_from(r), b, ldb, c + r * ldc, ldc, accumulate);
  if constexpr (MR > 1) {
    constexpr int H = MR / 2;
    if (m - r >= H) {
      dp_micro_kernel<H, NV>(kp, a.rows_from(r), b, ldb, c + r * ldc, ldc, accumulate);
      r += H;
    }
    if (m > r) dp_row_panel<(H > 1 ? H : 1), NV>(m - r, kp, a.rows_from(r), b, ldb, c + r * ldc, ldc, accumulate);
  }
}

template <int MR, int NV>
inline void dp_gemm(std::int64_t m, std::int64_t n, std::int64_t kp, MatW a, const std::uint32_t* b, std::int64_t ldb,
                    float* c, std::int64_t ldc, bool accumulate) {
  std::int64_t j = 0;
  for (; j + NV * 16 <= n; j += NV * 16) dp_row_panel<MR, NV>(m, kp, a, b + j, ldb, c + j, ldc, accumulate);
  for (; j < n; j += 16) dp_row_panel<MR, 1>(m, kp, a, b + j, ldb, c + j, ldc, accumulate);
}

// Word i of the result = 16-bit element i of the lower half | element i of the upper half << 16.
alignas(64) inline constexpr std::uint16_t kInterleave16[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                                21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                                11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// 32 bf16 (16 pairs) from two f32 vectors: word i = bf16(lo[i]) | bf16(hi[i]) << 16,
// rounded to nearest even (vcvtne2ps2bf16).
inline __m512i pack_pairs(__m512 lo, __m512 hi) {
  // cvtne2ps: elements 0..15 from the second operand, 16..31 from the first.
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  return _mm512_permutexvar_epi16(_mm512_loadu_si512(kInterleave16), both);
}

// Interleaves 16 bf16 of row a with 16 of row b: word i = a[i] | b[i] << 16.
inline __m512i interleave_rows(__m256i a, __m256i b) {
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  return _mm512_permutexvar_epi16(_mm512_loadu_si512(kInterleave16), both);
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
