// Copies between the user's rows and the kernels' contiguous tiles, shared by
// the forward and backward. Rows of one head sit H*D elements apart in the
// user's tensors; each helper touches them with whole-vector loads and stores.
// Included inside an ISA namespace.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/half_simd.h"

namespace attend::flash::ATTEND_FLASH_ISA {

// dst[d * ldd + r] = scale * src[r * ld + d] for d < cols and r < rows_pad (a
// multiple of W); rows from `rows` on are zeros. Each W x W block is read as W
// row loads (widened to f32) and transposed in registers (S::transpose): a
// scalar copy makes W*W strided reads and writes instead. A ragged last column
// block goes through a zero-padded copy so that no load reads past a row (the
// last row of a tensor may end right there). The products with `scale` are the
// very ones a scalar copy forms, so the tile is bit for bit the same.
template <class S, class E>
inline void pack_transposed(const E* src, std::int64_t ld, std::int64_t rows, std::int64_t rows_pad, std::int64_t cols,
                            float scale, float* dst, std::int64_t ldd) {
  using V = typename S::V;
  constexpr std::int64_t W = S::W;
  const V vscale = S::set1(scale);
  for (std::int64_t r0 = 0; r0 < rows_pad; r0 += W) {
    const std::int64_t nr = std::clamp<std::int64_t>(rows - r0, 0, W);
    for (std::int64_t d0 = 0; d0 < cols; d0 += W) {
      const std::int64_t nd = std::min(W, cols - d0);
      V t[W];
      for (std::int64_t i = 0; i < W; ++i) {
        if (i >= nr) {
          t[i] = S::zero();
          continue;
        }
        const E* row = src + (r0 + i) * ld + d0;
        if (nd == W) {
          t[i] = S::mul(detail::load_f32<S>(row), vscale);
        } else {
          float edge[W] = {};
          for (std::int64_t d = 0; d < nd; ++d) edge[d] = detail::to_f32(row[d]);
          t[i] = S::mul(S::load(edge), vscale);
        }
      }
      S::transpose(t);
      for (std::int64_t i = 0; i < nd; ++i) S::store(dst + (d0 + i) * ldd + r0, t[i]);
    }
  }
}

// dst[0, n) += src[0, n): the backward's dQ read-modify-write, once per tile
// row. Written with vectors, as the compiler cannot tell dst (the user's dq)
// from src apart and would guard its own vector loop with an overlap test.
template <class S>
inline void add_row(float* dst, const float* src, std::int64_t n) {
  std::int64_t d = 0;
  for (; d + S::W <= n; d += S::W) S::store(dst + d, S::add(S::load(dst + d), S::load(src + d)));
  for (; d < n; ++d) dst[d] += src[d];
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
