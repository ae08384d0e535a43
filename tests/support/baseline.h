// FlashAttention's same-precision-baseline rule (docs/semantics.md §7)
// for f32 kernels: the naive baseline is the reference backend accumulating in
// f32; the exact answer is the f64 reference. (half_baseline.h: bf16/f16.)
#pragma once

#include <gtest/gtest.h>

#include <algorithm>

#include "attend/attend.h"
#include "support/tensors.h"

namespace attend::testing {

// err(x) <= c * err(naive f32) + atol, c = 2 for outputs and LSE, 3 for
// gradients; atol a few f32 ulps at the quantity's magnitude (< 0: max |ref|).
// Gradients pass the largest of the three: one that cancels to ~0 (e.g. dq
// with a single key) still carries the rounding of the terms that cancelled,
// which the naive baseline may happen to avoid.
inline void expect_within_baseline(const char* what, const Tensor& x, const Tensor& naive, const Tensor& ref, double c,
                                   double magnitude = -1) {
  const double err = max_abs_diff(x, ref), err_naive = max_abs_diff(naive, ref);
  const double atol = 4 * 1.2e-7 * std::max(1.0, magnitude < 0 ? max_abs(ref) : magnitude);
  EXPECT_LE(err, c * err_naive + atol) << what << ": err " << err << ", naive f32 err " << err_naive << ", atol " << atol;
}

}  // namespace attend::testing
