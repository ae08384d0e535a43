// Tiles whose inputs hold a NaN or an infinity. The tile GEMMs multiply every
// (query, key) pair of a tile, masked pairs included, with a zero weight — and
// 0 * NaN = NaN: a bad key would poison the rows that cannot see it, a bad query
// or dO row the keys it cannot see. Such tiles (rare; detected with one
// multiply-add per element) take the products below over the visible pairs
// only, element by element in the GEMMs' order with the same fused
// multiply-adds, so every output the bad input does not reach keeps the value
// of a clean run. Finite tiles never come here and keep the GEMM speed.
// Included inside an ISA namespace, after logits_tile.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/flash/flash_params.h"
#include "cpu/half_simd.h"

namespace attend::flash::ATTEND_FLASH_ISA {

// Every element of rows row(0..n) (`cols` elements each) is finite: x * 0 is 0
// for finite x and NaN otherwise, so one sum decides.
template <class S, class E, class Row>
inline bool rows_finite(std::int64_t n, std::int64_t cols, Row row) {
  typename S::V acc = S::zero();
  const typename S::V zero = S::zero();
  float tail = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    const E* r = row(j);
    std::int64_t d = 0;
    for (; d + S::W <= cols; d += S::W) acc = S::fmadd(detail::load_f32<S>(r + d), zero, acc);
    for (; d < cols; ++d) tail += detail::to_f32(r[d]) * 0.0f;
  }
  return S::reduce_add(acc) + tail == 0.0f;
}

// A row-major f32 tile (ld floats apart).
template <class S>
inline bool tile_finite(const float* t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows_finite<S, float>(rows, cols, [&](std::int64_t r) { return t + r * ld; });
}

// Forward, acc[r] += sum_j P[j][r] v_j over the keys [j0, j0 + n) that query
// i0 + r sees, for rows [r0, r1). P is key-major (ldp floats between keys); the
// accumulator element (r, d) is acc[r * ars + d * ads]. E is V's element
// type; an 8-bit code is multiplied by its scale first, as the packed rows are.
template <class S, class E>
inline void visible_pv(const FlashParams& p, std::int64_t b, std::int64_t hk, const detail::SeqSpan& span,
                       std::int64_t i0, std::int64_t r0, std::int64_t r1, std::int64_t j0, std::int64_t n,
                       const float* pt, std::int64_t ldp, float* acc, std::int64_t ars, std::int64_t ads) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const detail::KeyRange vis = p.keys(i0 + r, span);
    const std::int64_t lo = std::clamp<std::int64_t>(vis.begin - j0, 0, n);
    const std::int64_t hi = std::clamp<std::int64_t>(vis.end - j0, lo, n);
    for (std::int64_t j = lo; j < hi; ++j) {
      const E* v = p.v_row<E>(b, span, j0 + j, hk);
      const float w = pt[j * ldp + r];
      const float vs = sizeof(E) == 1 ? p.vscale.at(p.pages, b, span.kv_begin + j0 + j, hk) : 1.0f;
      for (std::int64_t d = 0; d < p.dv; ++d) {
        float& a = acc[r * ars + d * ads];
        a = S::fmadd1(w, sizeof(E) == 1 ? detail::to_f32(v[d]) * vs : detail::to_f32(v[d]), a);
      }
    }
  }
}

// Backward, the three products of one (query block, key block) tile over its
// visible pairs, with P' and scale * dS query-major (ld floats between rows):
//   dV[j] += P'[r][j] dO_r;  dK[j] += dS[r][j] q_r;  dq_tile[r] = sum_j dS[r][j] k_j.
// A row with LSE = -inf is fully masked and contributes nothing.
template <class S, class E>
void visible_tile_products(const FlashParams& p, std::int64_t b, std::int64_t h, const detail::SeqSpan& span,
                           std::int64_t i0, std::int64_t m, std::int64_t j0, std::int64_t n, const float* pt,
                           const float* ds, std::int64_t ld, const float* lse, float* dv_acc, std::int64_t dvp,
                           float* dk_acc, std::int64_t dqp, float* dq_tile) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::int64_t hk = h / p.group, row0 = span.q_begin + i0;
  const auto range = [&](std::int64_t r) {
    if (lse[r] == kNegInf) return detail::KeyRange{0, 0};
    const detail::KeyRange vis = p.keys(i0 + r, span);
    const std::int64_t lo = std::clamp<std::int64_t>(vis.begin - j0, 0, n);
    return detail::KeyRange{lo, std::clamp<std::int64_t>(vis.end - j0, lo, n)};
  };
  std::fill(dq_tile, dq_tile + m * dqp, 0.0f);
  for (std::int64_t r = 0; r < m; ++r) {
    const E* q = p.q_as<E>() + p.sq.offset(b, row0 + r, h);
    const E* dout = p.dout_as<E>() + p.sdo.offset(b, row0 + r, h);
    const detail::KeyRange vis = range(r);
    for (std::int64_t j = vis.begin; j < vis.end; ++j) {
      const float w = pt[r * ld + j], g = ds[r * ld + j];
      for (std::int64_t d = 0; d < p.dv; ++d)
        dv_acc[j * dvp + d] = S::fmadd1(w, detail::to_f32(dout[d]), dv_acc[j * dvp + d]);
      for (std::int64_t d = 0; d < p.dqk; ++d)
        dk_acc[j * dqp + d] = S::fmadd1(g, detail::to_f32(q[d]), dk_acc[j * dqp + d]);
      const E* k = p.k_row<E>(b, span, j0 + j, hk);
      for (std::int64_t d = 0; d < p.dqk; ++d)
        dq_tile[r * dqp + d] = S::fmadd1(g, detail::to_f32(k[d]), dq_tile[r * dqp + d]);
    }
  }
}

// A finished row from its running max and sum. l = 0 is an empty row (no
// visible key, or every logit -inf): O = 0 and LSE = -inf (the sink logit
// with a sink) whatever its accumulator met (a zero weight times a NaN v). A
// NaN sum (a NaN or +inf logit) makes O and the LSE NaN.
using RowEnd = detail::RowFinish<float>;
// `sink`: the row's sink logit, -inf without one (kernel/softmax_sink.h).
inline RowEnd row_end(float row_max, float l, float sink) { return detail::finish_row(row_max, l, sink); }

// The m rows' ends of a forward block, in place of their running max and sum:
// row_max[r] becomes the LSE, row_sum[r] the factor 1/l and empty[r] 1 for an
// empty row (else 0), for the output stores that follow. finish_row is
// baseline (SSE) code shared by every path. Called per row with the upper
// halves of the vector registers dirty (no vzeroupper inside the loop) and
// the row's stores in between, each of its instructions waited on them: the
// row finish was ~7 % of a causal S = 512, D = 64 forward (perf), ~1 % now.
template <class S>
inline void finish_rows(std::int64_t m, float sink, float* row_max, float* row_sum, float* empty) {
  S::clean_upper();
  for (std::int64_t r = 0; r < m; ++r) {
    const RowEnd e = row_end(row_max[r], row_sum[r], sink);
    row_max[r] = e.lse;
    row_sum[r] = e.inv;
    empty[r] = e.empty ? 1.0f : 0.0f;
  }
}

// The rows' LSEs hold no NaN (-inf is a fully masked row, not a bad input) and
// their D = rowsum(dO * O) are finite.
inline bool lse_and_d_clean(const float* lse, const float* d, std::int64_t m) {
  for (std::int64_t r = 0; r < m; ++r) {
    if (std::isnan(lse[r]) || !std::isfinite(d[r])) return false;
  }
  return true;
}

// A softmax-gradient row term D that is not finite becomes NaN: the row was
// reached by a NaN or an infinity (in dO, v or its logits), and its dS is then
// NaN at every key it sees on every backend, whichever infinities the
// different ways of forming D (rowsum(dO * O), or sum_j P dP) would meet.
inline void nan_unless_finite(float* d, std::int64_t m) {
  for (std::int64_t i = 0; i < m; ++i) {
    if (!std::isfinite(d[i])) d[i] = std::numeric_limits<float>::quiet_NaN();
  }
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
