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

// ALiBi, as documented by FlashAttention: -slope * |i + sk - sq - j|, in every
// mask mode (we do not use FA2's causal shortcut, so LSE is the same either way).
inline double alibi_term(double slope, std::int64_t i, std::int64_t j, std::int64_t sq,
                         std::int64_t sk) {
  return -slope * static_cast<double>(std::llabs(i + sk - sq - j));
}

}  // namespace attend::detail
