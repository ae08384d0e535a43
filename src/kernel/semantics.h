// The per-element rules every backend must apply identically: which keys a
// query row may see (bottom-right aligned causal/window masks, shifted by the
// partial problem's offsets) and the ALiBi term. Backends call these instead of
// re-deriving the formulas. Plain structs and arithmetic: the functions compile
// for host and device code (ATTEND_HD).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "attend/spec.h"
#include "kernel/hd.h"

namespace attend::detail {

// The mask of a spec as kernel parameters: no pointer back into the API.
struct MaskRule {
  std::int64_t window_left = -1;   // -1: unbounded
  std::int64_t window_right = -1;  // after causal's normalisation to 0; -1: unbounded
  // Positions of a partial problem: query row i sits at q_offset + i, key j at
  // kv_offset + j (AttentionSpec::q_offset, kv_offset). Masks and ALiBi use
  // their difference; the dropout counter uses both.
  std::int64_t q_offset = 0, kv_offset = 0;
};

inline MaskRule mask_rule(const AttentionSpec& spec) {
  return {spec.window_left, spec.effective_window_right(), spec.q_offset, spec.kv_offset};
}

// Keys [begin, end) visible to query row i of a sequence with sq queries and sk
// keys. Row i sits at key position i + sk - sq + q_offset - kv_offset
// (bottom-right alignment, shifted); the window keeps pos-left <= j <= pos+right.
// Empty when end <= begin.
struct KeyRange {
  std::int64_t begin = 0, end = 0;
  ATTEND_HD bool empty() const { return end <= begin; }
};

// The diagonal key position of query row i.
ATTEND_HD inline std::int64_t diagonal(const MaskRule& m, std::int64_t i, std::int64_t sq, std::int64_t sk) {
  return i + sk - sq + m.q_offset - m.kv_offset;
}

ATTEND_HD inline KeyRange visible_keys(const MaskRule& m, std::int64_t i, std::int64_t sq, std::int64_t sk) {
  const std::int64_t pos = diagonal(m, i, sq, sk);
  KeyRange r{0, sk};
  // Compared before subtracting/adding: a window may be as wide as INT64_MAX
  // (validate() allows it), and pos - left or pos + right + 1 would overflow.
  // |pos| < 2^62 (sizes are bounded by their tensors' bytes, offsets by 2^40).
  if (m.window_left >= 0) r.begin = m.window_left >= pos ? 0 : std::min(sk, pos - m.window_left);
  if (m.window_right >= 0) r.end = m.window_right >= sk - pos - 1 ? sk : pos + m.window_right + 1;
  return r;
}

// Queries [begin, end) that see key j: the inverse of visible_keys. Because a
// row's visible range only moves right as i grows, they form one interval. With
// t = j - (diagonal of row 0): j < end_i <=> i >= t - right, and begin_i <= j <=> i <= t + left.
ATTEND_HD inline KeyRange visible_queries(const MaskRule& m, std::int64_t j, std::int64_t sq, std::int64_t sk) {
  if (j < 0 || j >= sk) return {0, 0};
  const std::int64_t t = j - diagonal(m, 0, sq, sk);
  KeyRange r{0, sq};
  if (m.window_right >= 0) r.begin = m.window_right >= t ? 0 : std::min(sq, t - m.window_right);
  if (m.window_left >= 0) r.end = m.window_left >= sq - t - 1 ? sq : std::max<std::int64_t>(0, t + m.window_left + 1);
  return r;
}

// Spec-taking forms for host code (the reference backend, tests).
inline KeyRange visible_keys(const AttentionSpec& spec, std::int64_t i, std::int64_t sq, std::int64_t sk) {
  return visible_keys(mask_rule(spec), i, sq, sk);
}
inline KeyRange visible_queries(const AttentionSpec& spec, std::int64_t j, std::int64_t sq, std::int64_t sk) {
  return visible_queries(mask_rule(spec), j, sq, sk);
}

// ALiBi, as documented by FlashAttention: -slope * |diagonal(i) - j|, in every
// mask mode (we do not use FA2's causal shortcut, so LSE is the same either way).
ATTEND_HD inline double alibi_term(const MaskRule& m, double slope, std::int64_t i, std::int64_t j, std::int64_t sq,
                                   std::int64_t sk) {
  const std::int64_t d = diagonal(m, i, sq, sk) - j;
  return -slope * static_cast<double>(d < 0 ? -d : d);
}

}  // namespace attend::detail
