// The per-element rules every backend must apply identically: which keys a
// query row may see (bottom-right aligned causal/window masks) and the ALiBi
// term. Backends call these instead of re-deriving the formulas.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "attend/spec.h"

namespace attend::detail {

// Keys [begin, end) visible to query row i of a sequence with sq queries and sk
// keys. Row i sits at key position i + sk - sq (bottom-right alignment); the
// window keeps i+off-left <= j <= i+off+right. Empty when end <= begin.
struct KeyRange {
  std::int64_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
};

inline KeyRange visible_keys(const AttentionSpec& spec, std::int64_t i, std::int64_t sq,
                             std::int64_t sk) {
  const std::int64_t pos = i + sk - sq;
  const std::int64_t right = spec.effective_window_right();
  KeyRange r{0, sk};
  // Compared before subtracting/adding: a window may be as wide as INT64_MAX
  // (validate() allows it), and pos - left or pos + right + 1 would overflow.
  // sk - pos = sq - i >= 1, so neither comparison can.
  if (spec.window_left >= 0) r.begin = spec.window_left >= pos ? 0 : pos - spec.window_left;
  if (right >= 0) r.end = right >= sk - pos - 1 ? sk : pos + right + 1;
  return r;
}

// Queries [begin, end) that see key j: the inverse of visible_keys. Because a
// row's visible range only moves right as i grows, they form one interval. With
// t = j - (sk - sq): j < end_i <=> i >= t - right, and begin_i <= j <=> i <= t + left.
// Compared before adding, as above (t lies in (sq - sk, sq], so sq - t cannot overflow).
inline KeyRange visible_queries(const AttentionSpec& spec, std::int64_t j, std::int64_t sq, std::int64_t sk) {
  if (j < 0 || j >= sk) return {0, 0};
  const std::int64_t t = j - (sk - sq);
  const std::int64_t right = spec.effective_window_right();
  KeyRange r{0, sq};
  if (right >= 0) r.begin = right >= t ? 0 : std::min(sq, t - right);
  if (spec.window_left >= 0) r.end = spec.window_left >= sq - t - 1 ? sq : std::max<std::int64_t>(0, t + spec.window_left + 1);
  return r;
}

// ALiBi, as documented by FlashAttention: -slope * |i + sk - sq - j|, in every
// mask mode (we do not use FA2's causal shortcut, so LSE is the same either way).
inline double alibi_term(double slope, std::int64_t i, std::int64_t j, std::int64_t sq,
                         std::int64_t sk) {
  return -slope * static_cast<double>(std::llabs(i + sk - sq - j));
}

}  // namespace attend::detail
