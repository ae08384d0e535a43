// Register-blocked GEMM for the small tiles of the flash kernels:
//   C[m x n] (= or +=) A[m x k] * B[k x n]
// With accumulate, the k products of each element are summed from zero and
// the tile's sum is then added to C, not chained onto C's running value: dK/dV
// add one such tile per query block over every row of a GQA group (and O one
// per key block), so a chain would be one sequential f32 sum of group * Sq
// terms, with an error growing like its length, where blocks of k keep it near
// sqrt(n k) + n / sqrt(k) (FlashAttention's f32 rule failed on MHA/MQA dK/dV
// at 4,096 rows). The extra add per accumulator is 1/k of the multiply-adds.
// A is addressed as A(r, p) = a[r * ars + p * aps], so a tile can be used
// transposed without copying it (its elements are broadcast one at a time).
// B and C are row-major (ldb, ldc in floats) and n must be a multiple of Simd::W,
// so B rows may be read in place from the user's tensors whenever the head
// dimension is a multiple of W. One micro-kernel shape per ISA
// (KernelTraits::mr x nv vectors); edges reuse it with fewer rows or one vector.
// Included inside an ISA namespace.
#pragma once

#include <algorithm>
#include <cstdint>

namespace attend::flash::ATTEND_FLASH_ISA {

struct MatA {
  const float* a;
  std::int64_t rs, ps;  // row stride, depth stride
  MatA rows_from(std::int64_t r) const { return {a + r * rs, rs, ps}; }
};

template <class S, int MR, int NV>
inline void micro_kernel(std::int64_t k, MatA a, const float* b, std::int64_t ldb, float* c, std::int64_t ldc,
                         bool accumulate) {
  typename S::V acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = S::zero();
  }
  for (std::int64_t p = 0; p < k; ++p) {
    typename S::V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = S::load(b + p * ldb + v * S::W);
    const float* ap = a.a + p * a.ps;
    for (int r = 0; r < MR; ++r) {
      const typename S::V av = S::set1(ap[r * a.rs]);
      for (int v = 0; v < NV; ++v) acc[r][v] = S::fmadd(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      float* cv = c + r * ldc + v * S::W;
      S::store(cv, accumulate ? S::add(S::load(cv), acc[r][v]) : acc[r][v]);
    }
  }
}

// Rows [0, m) of one column panel; the row remainder is peeled with halved
// instantiations, so every row count is handled exactly.
template <class S, int MR, int NV>
inline void row_panel(std::int64_t m, std::int64_t k, MatA a, const float* b, std::int64_t ldb, float* c,
                      std::int64_t ldc, bool accumulate) {
  std::int64_t r = 0;
  for (; r + MR <= m; r += MR) micro_kernel<S, MR, NV>(k, a.rows_from(r), b, ldb, c + r * ldc, ldc, accumulate);
  if constexpr (MR > 1) {
    constexpr int H = MR / 2;
    if (m - r >= H) {
      micro_kernel<S, H, NV>(k, a.rows_from(r), b, ldb, c + r * ldc, ldc, accumulate);
      r += H;
    }
    if (m > r) row_panel<S, (H > 1 ? H : 1), NV>(m - r, k, a.rows_from(r), b, ldb, c + r * ldc, ldc, accumulate);
  }
}

template <class S, int MR, int NV>
inline void gemm(std::int64_t m, std::int64_t n, std::int64_t k, MatA a, const float* b, std::int64_t ldb, float* c,
                 std::int64_t ldc, bool accumulate) {
  std::int64_t j = 0;
  for (; j + NV * S::W <= n; j += NV * S::W) row_panel<S, MR, NV>(m, k, a, b + j, ldb, c + j, ldc, accumulate);
  for (; j < n; j += S::W) row_panel<S, MR, 1>(m, k, a, b + j, ldb, c + j, ldc, accumulate);
}

// Depth of one chain of a blocked dot (dot_blocked), and the least depth
// that is blocked: at D = 96 the 64 + 32 split measured worse than one chain
// on a drawn few-keys case (dq 1.24 x the strict bound under Debian PyTorch's
// OpenBLAS baseline, within it before), so shorter dots keep one chain.
inline constexpr std::int64_t kDotChunk = 64, kDotBlockedFrom = 128;

// C = A B for dots over a long depth (the scores, dP): each element is summed
// in chains of kDotChunk products from zero, the chains then added in order.
// One chain over the whole head dim has an error growing like its length:
// at D = 256 the scores' rms error was 2.1e-6, 2.3 x that of a blocked sgemm
// such as the one PyTorch's f32 baseline runs, and dS = P (dP - D) of a row of
// few keys cancels so that dQ inherits it in full: with 8 to 64 keys at D 256,
// MQA, scales 0.3 to 1, dQ missed FlashAttention's strict rule at up to 2.4 x
// and the output its 2 x rule at 1.9 x. Costs one tile pass per chunk past
// the first, ~1/kDotChunk of the products. The forward and the
// backward form the scores through it in the same order, so the backward's
// P = exp(s - LSE) stays exactly the forward's.
template <class S, int MR, int NV>
inline void dot_blocked(std::int64_t m, std::int64_t n, std::int64_t k, MatA a, const float* b, std::int64_t ldb,
                        float* c, std::int64_t ldc) {
  if (k < kDotBlockedFrom) return gemm<S, MR, NV>(m, n, k, a, b, ldb, c, ldc, false);
  for (std::int64_t p = 0; p < k; p += kDotChunk) {
    const MatA ap{a.a + p * a.ps, a.rs, a.ps};
    gemm<S, MR, NV>(m, n, std::min(kDotChunk, k - p), ap, b + p * ldb, ldb, c, ldc, p > 0);
  }
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
