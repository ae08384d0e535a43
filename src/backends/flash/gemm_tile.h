// Register-blocked GEMM for the small tiles of the flash kernels:
//   C[m x n] (= or +=) A[m x k] * B[k x n]
// A and B row-major (lda, ldb in floats), n a multiple of Simd::W. One
// micro-kernel shape per ISA (KernelTraits::mr x nv vectors); edges use the
// same code with fewer rows or one vector. Included inside an ISA namespace.
#pragma once

#include <cstdint>

namespace attend::flash::ATTEND_FLASH_ISA {

template <class S, int MR, int NV>
inline void micro_kernel(std::int64_t k, const float* a, std::int64_t lda, const float* b,
                         std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  typename S::V acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? S::load(c + r * ldc + v * S::W) : S::zero();
  }
  for (std::int64_t p = 0; p < k; ++p) {
    typename S::V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = S::load(b + p * ldb + v * S::W);
    for (int r = 0; r < MR; ++r) {
      const typename S::V av = S::set1(a[r * lda + p]);
      for (int v = 0; v < NV; ++v) acc[r][v] = S::fmadd(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) S::store(c + r * ldc + v * S::W, acc[r][v]);
  }
}

// Runs the (MR, NV) kernel on rows [0, m) of a column panel, peeling the row
// remainder with smaller instantiations so every row count is exact.
template <class S, int MR, int NV>
inline void row_panel(std::int64_t m, std::int64_t k, const float* a, std::int64_t lda, const float* b,
                      std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  std::int64_t r = 0;
  for (; r + MR <= m; r += MR) micro_kernel<S, MR, NV>(k, a + r * lda, lda, b, ldb, c + r * ldc, ldc, accumulate);
  if constexpr (MR > 1) {
    const std::int64_t rest = m - r;
    if (rest > 0) {
      // Halve until the remainder fits: at most log2(MR) extra calls.
      constexpr int H = MR / 2;
      if (rest >= H) {
        micro_kernel<S, H, NV>(k, a + r * lda, lda, b, ldb, c + r * ldc, ldc, accumulate);
        r += H;
      }
      row_panel<S, (H > 1 ? H : 1), NV>(m - r, k, a + r * lda, lda, b, ldb, c + r * ldc, ldc, accumulate);
    }
  }
}

template <class S, int MR, int NV>
inline void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                 const float* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  std::int64_t j = 0;
  for (; j + NV * S::W <= n; j += NV * S::W) row_panel<S, MR, NV>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  for (; j < n; j += S::W) row_panel<S, MR, 1>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
