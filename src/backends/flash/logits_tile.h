// Turning a tile of scaled scores into final logits — softcap, ALiBi, bias, mask —
// shared by forward and backward so both see exactly the same numbers. A tile
// is stored either query-major (rows = queries, the backward's S) or key-major
// (rows = keys, the forward's S^T); the rules are the same, only addressing differs.
// Included inside an ISA namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "backends/flash/flash_params.h"
#include "cpu/half_simd.h"

namespace attend::flash::ATTEND_FLASH_ISA {

struct Tile {
  std::int64_t b, h;          // batch and query head
  std::int64_t i0, m;         // first query (sequence-local) and query count
  std::int64_t j0, n;         // first key (sequence-local) and key count
  detail::SeqSpan span;
  float* s;                   // the scores
  std::int64_t ld;            // floats between rows
  bool key_major;             // rows are keys (else queries)
  std::int64_t rows, cols;    // stored extent (cols padded to a multiple of W)

  float& at(std::int64_t i, std::int64_t j) const { return key_major ? s[j * ld + i] : s[i * ld + j]; }
};

// softcap * tanh(s / softcap) over the whole stored extent; its derivative
// 1 - tanh^2 kept in `dcap` (same layout) when the backward needs it.
template <class S>
inline void apply_softcap(const FlashParams& p, const Tile& t, float* dcap) {
  const typename S::V inv = S::set1(1.0f / p.softcap), cap = S::set1(p.softcap);
  for (std::int64_t r = 0; r < t.rows; ++r) {
    for (std::int64_t c = 0; c < t.cols; c += S::W) {
      const typename S::V x = S::mul(S::load(t.s + r * t.ld + c), inv);
      if (dcap) S::store(dcap + r * t.ld + c, S::sech2(x));
      S::store(t.s + r * t.ld + c, S::mul(S::tanh(x), cap));
    }
  }
}

template <class S, class E>
inline void finish_logits(const FlashParams& p, const Tile& t, float* dcap) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (p.softcap > 0) apply_softcap<S>(p, t, dcap);
  const float slope = p.alibi ? p.slope(t.b, t.h) : 0.0f;
  const std::int64_t off = p.alibi_shift(t.span);  // row i's diagonal is i + off
  for (std::int64_t r = 0; r < t.m; ++r) {
    const std::int64_t i = t.i0 + r;
    if (p.alibi) {
      for (std::int64_t c = 0; c < t.n; ++c) t.at(r, c) -= slope * static_cast<float>(std::llabs(i + off - (t.j0 + c)));
    }
    if (p.bias) {
      const E* brow = p.bias_as<E>() + p.sbias.offset(t.b, t.h, i) + t.j0;
      for (std::int64_t c = 0; c < t.n; ++c) t.at(r, c) += detail::to_f32(brow[c]);
    }
    if (t.key_major) continue;
    // Mask the keys outside this query's window, and the padding keys.
    const detail::KeyRange vis = p.keys(i, t.span);
    const std::int64_t lo = std::clamp<std::int64_t>(vis.begin - t.j0, 0, t.n);
    const std::int64_t hi = std::clamp<std::int64_t>(vis.end - t.j0, lo, t.n);
    float* row = t.s + r * t.ld;
    std::fill(row, row + lo, kNegInf);
    std::fill(row + hi, row + t.cols, kNegInf);
  }
  if (t.key_major) {
    // Rows are keys: the queries that see key j form one interval, so each
    // row is masked with two contiguous fills.
    for (std::int64_t c = 0; c < t.n; ++c) {
      const detail::KeyRange q = p.queries(t.j0 + c, t.span);
      const std::int64_t lo = std::clamp<std::int64_t>(q.begin - t.i0, 0, t.m);
      const std::int64_t hi = std::clamp<std::int64_t>(q.end - t.i0, lo, t.m);
      float* row = t.s + c * t.ld;
      std::fill(row, row + lo, kNegInf);
      std::fill(row + hi, row + t.m, kNegInf);
    }
  }
}

// Multiplies P by keep/(1-p), the mask drawn from the shared Philox function.
inline void apply_dropout(const FlashParams& p, const Tile& t) {
  for (std::int64_t r = 0; r < t.m; ++r) {
    const std::int64_t i = t.i0 + r + p.mask.q_offset;  // the mask is drawn at global positions
    for (std::int64_t c = 0; c < t.n;) {
      const std::int64_t col = t.j0 + c + p.mask.kv_offset;
      const auto words = p.dropout_mask.words(t.b, t.h, i, col >> 2);
      for (std::int64_t w = col & 3; w < 4 && c < t.n; ++w, ++c) {
        float& x = t.at(r, c);
        // x * 0, not 0: a dropped NaN or infinite weight stays NaN (IEEE, as the reference).
        x *= words[w] < p.dropout_mask.threshold ? p.dropout_scale : 0.0f;
      }
    }
  }
}

// One online-softmax step over a key-major tile (n key rows, ld floats apart),
// vectorised across query columns [c0, c1): raises each query's running max,
// turns the scores into exp(s - max) in place, and rescales the running sum;
// alpha receives the factor the output accumulator must be scaled by. A query
// with nothing visible yet keeps max = -inf; subtracting max(m, -FLT_MAX)
// keeps exp() at 0, not NaN.
template <class S>
inline void online_softmax_step(float* st, std::int64_t ld, std::int64_t n, std::int64_t c0, std::int64_t c1,
                                float* row_max, float* row_sum, float* alpha) {
  using V = typename S::V;
  const V floor = S::set1(std::numeric_limits<float>::lowest());
  for (std::int64_t c = c0; c < c1; c += S::W) {
    const V old_max = S::load(row_max + c);
    V new_max = old_max;
    for (std::int64_t j = 0; j < n; ++j) new_max = S::max(new_max, S::load(st + j * ld + c));
    const V shift = S::max(new_max, floor);
    V sum = S::zero();
    for (std::int64_t j = 0; j < n; ++j) {
      const V e = S::exp(S::sub(S::load(st + j * ld + c), shift));
      S::store(st + j * ld + c, e);
      sum = S::add(sum, e);
    }
    const V a = S::exp(S::sub(old_max, shift));
    S::store(alpha + c, a);
    S::store(row_max + c, new_max);
    S::store(row_sum + c, S::fmadd(S::load(row_sum + c), a, sum));
  }
}

// dst[0, ldp) = src[0, n) widened to f32, followed by zeros.
template <class S, class E>
inline void copy_row(const E* src, std::int64_t n, float* dst, std::int64_t ldp) {
  std::int64_t d = 0;
  for (; d + S::W <= n; d += S::W) S::store(dst + d, detail::load_f32<S>(src + d));
  for (; d < n; ++d) dst[d] = detail::to_f32(src[d]);
  for (; d < ldp; ++d) dst[d] = 0.0f;
}

// Pulls n elements into L2 ahead of use (one prefetch per 64-byte line).
template <class E>
inline void prefetch_row(const E* src, std::int64_t n) {
  constexpr std::int64_t kLine = 64 / static_cast<std::int64_t>(sizeof(E));
  for (std::int64_t d = 0; d < n; d += kLine) __builtin_prefetch(src + d, 0, 2);
}

// dot(a, b) over n elements, vectorised (the scalar loop would serialise on FMA latency).
// A and E: float, bf16_t or f16_t, each widened as it is loaded.
template <class S, class A, class E>
inline float dot(const A* a, const E* b, std::int64_t n) {
  typename S::V acc = S::zero();
  std::int64_t d = 0;
  for (; d + S::W <= n; d += S::W) acc = S::fmadd(detail::load_f32<S>(a + d), detail::load_f32<S>(b + d), acc);
  float sum = S::reduce_add(acc);
  for (; d < n; ++d) sum = std::fma(detail::to_f32(a[d]), detail::to_f32(b[d]), sum);
  return sum;
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
