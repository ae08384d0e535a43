// Turning a tile of raw scores q.k into final logits, shared by forward and
// backward so both see exactly the same numbers: softcap, ALiBi, bias, mask.
// Included inside an ISA namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/flash/flash_params.h"

namespace attend::flash::ATTEND_FLASH_ISA {

struct TileCoords {
  std::int64_t b, h;          // batch and query head
  std::int64_t i0, m;         // first query row (sequence-local) and row count
  std::int64_t j0, n, n_pad;  // first key (sequence-local), key count, padded width
  detail::SeqSpan span;
};

// Rewrites S (m rows, ld = lds) from scale*q.k into logits. With softcap, also
// stores tanh(.) per element in `tanh_out` (same layout) for the backward.
template <class S>
inline void finish_logits(const FlashParams& p, const TileCoords& t, float* s, std::int64_t lds,
                          float* tanh_out) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float slope = p.alibi ? p.slope(t.b, t.h) : 0.0f;
  const std::int64_t off = t.span.kv_len - t.span.q_len;
  for (std::int64_t r = 0; r < t.m; ++r) {
    float* row = s + r * lds;
    const std::int64_t i = t.i0 + r;
    if (p.softcap > 0) {
      const typename S::V inv = S::set1(1.0f / p.softcap), cap = S::set1(p.softcap);
      for (std::int64_t j = 0; j < t.n_pad; j += S::W) {
        const typename S::V th = S::tanh(S::mul(S::load(row + j), inv));
        if (tanh_out) S::store(tanh_out + r * lds + j, th);
        S::store(row + j, S::mul(th, cap));
      }
    }
    if (p.alibi) {
      for (std::int64_t j = 0; j < t.n; ++j) {
        row[j] -= slope * static_cast<float>(std::llabs(i + off - (t.j0 + j)));
      }
    }
    if (p.bias) {
      const float* brow = p.bias + p.sbias.offset(t.b, t.h, i) + t.j0;
      for (std::int64_t j = 0; j < t.n; ++j) row[j] += brow[j];
    }
    // Mask: keys outside this row's window, and the padding columns.
    const detail::KeyRange vis = p.keys(i, t.span);
    const std::int64_t lo = std::clamp<std::int64_t>(vis.begin - t.j0, 0, t.n);
    const std::int64_t hi = std::clamp<std::int64_t>(vis.end - t.j0, lo, t.n);
    for (std::int64_t j = 0; j < lo; ++j) row[j] = kNegInf;
    for (std::int64_t j = hi; j < t.n_pad; ++j) row[j] = kNegInf;
  }
}

// Multiplies row r of P (m x n, ld) by keep/(1-p) using the shared Philox mask.
inline void apply_dropout(const FlashParams& p, const TileCoords& t, float* s, std::int64_t lds) {
  for (std::int64_t r = 0; r < t.m; ++r) {
    float* row = s + r * lds;
    const std::int64_t i = t.i0 + r;
    for (std::int64_t j = 0; j < t.n;) {
      const std::int64_t col = t.j0 + j;
      const auto words = p.dropout_mask.words(t.b, t.h, i, col >> 2);
      for (std::int64_t c = col & 3; c < 4 && j < t.n; ++c, ++j) {
        row[j] = words[c] < p.dropout_mask.threshold ? row[j] * p.dropout_scale : 0.0f;
      }
    }
  }
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
