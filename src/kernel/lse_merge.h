// The exact combination of partial softmax results through their LSEs, shared
// by attend::merge and decode's split-KV combine (one formula, one NaN rule):
//   lse = m + log sum_s exp(lse_s - m),  m = max_s lse_s
//   w_s = exp(lse_s - lse)              (O = sum_s w_s O_s)
// A part with lse_s = -inf weighs 0; if every part is -inf the row is empty
// (O = 0, LSE = -inf). A NaN lse_s makes lse NaN, and with it every weight.
// Plain arithmetic on scalars: compiles for host and device code.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace attend::detail {

// lse of `n` parts whose LSEs are lse(0..n-1) (a callable, so any storage works).
template <class T, class LseAt>
T merged_lse(std::int64_t n, LseAt&& lse) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  T mx = kNegInf;
  bool nan = false;
  for (std::int64_t s = 0; s < n; ++s) {
    const T x = lse(s);
    nan |= std::isnan(x);
    if (x > mx) mx = x;
  }
  if (nan) return std::numeric_limits<T>::quiet_NaN();
  if (mx == kNegInf) return kNegInf;
  T total = 0;
  for (std::int64_t s = 0; s < n; ++s) total += std::exp(lse(s) - mx);
  return mx + std::log(total);
}

// Weight of a part with LSE `part` in a row whose merged LSE is `lse`; 0 for
// an empty row (lse = -inf), NaN when lse is NaN.
template <class T>
T merge_weight(T part, T lse) {
  if (lse == -std::numeric_limits<T>::infinity()) return T(0);
  return std::exp(part - lse);
}

}  // namespace attend::detail
