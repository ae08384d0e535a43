// The attention-sink term of a softmax row (AttentionSpec::softmax_type), as
// every backend finishes a row: the running max m and sum l = sum_j exp(s_j - m)
// of the visible logits are joined by the sink logit z, which adds exp(z) to the
// denominator and nothing to the output. One formula for flash, decode and the
// merge rule of docs/semantics.md. Plain arithmetic: host and device code.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attend/spec.h"

namespace attend::detail {

// The sink logits of a problem as kernel parameters: z(h) is 0 for off_by_one,
// logits[h] for learnable and -inf (no sink) for vanilla.
struct SinkLogits {
  SoftmaxType type = SoftmaxType::vanilla;
  const float* logits = nullptr;  // learnable: (H), contiguous
  bool any() const { return type != SoftmaxType::vanilla; }
  float operator()(std::int64_t h) const {
    if (type == SoftmaxType::learnable) return logits[h];
    return type == SoftmaxType::off_by_one ? 0.0f : -std::numeric_limits<float>::infinity();
  }
};

// How a finished row is written: O = acc * inv, LSE = lse; empty rows write
// O = 0 whatever the accumulator met.
template <class T>
struct RowFinish {
  T inv, lse;
  bool empty;
};

// From the row's running max m and sum l (l = 0: no visible key, or every
// logit -inf) and its sink logit z (-inf: none). Without a sink an empty row
// has LSE = -inf; with one it has LSE = z, and O = 0 either way. A NaN m or l
// makes inv and the LSE NaN, as without a sink.
template <class T>
RowFinish<T> finish_row(T m, T l, T z) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (z == kNegInf) {
    if (l == T(0)) return {T(0), kNegInf, true};
    return {T(1) / l, m + std::log(l), false};
  }
  if (l == T(0)) return {T(0), z, true};
  // M = max(m, z) keeps both exponentials <= 1; a NaN m stays NaN (m > z is false).
  const T mx = (std::isnan(m) || m > z) ? m : z;
  const T a = std::exp(m - mx);
  const T sum = l * a + std::exp(z - mx);
  return {a / sum, mx + std::log(sum), false};
}

}  // namespace attend::detail
