// FlashAttention's same-precision-baseline rule (docs/semantics.md §7)
// for bf16/f16 inputs:
//   ref   = the f64 reference on the exact (upcast) half inputs, its outputs and
//           gradients rounded to the input dtype (FA's attention_ref(upcast=True));
//   naive = the reference backend with f32 accumulation and every intermediate
//           matrix rounded to the input dtype (ReferenceOptions::
//           round_intermediates_to_input_dtype) — a naive same-precision
//           implementation, FA's attention_ref(upcast=False);
//   pass  <=> max|x - ref| <= C * max|naive - ref| + atol,
// C = 2 for the output and LSE, 3 for gradients; atol = FA3's floor
// 2 * max|(ref + 0.3 - 0.3) - ref| in the dtype (rounding_floor).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "support/tensors.h"

namespace attend {
// gtest prints parameters through PrintTo: DType by name, not as a byte.
inline void PrintTo(DType dtype, std::ostream* os) { *os << to_string(dtype); }
}  // namespace attend

namespace attend::testing {

// The problem with q, k, v, dout and bias converted to `dtype` (rounded to
// nearest even); index tensors, slopes and paged tables shared.
inline Problem problem_as(const Problem& p, DType dtype) {
  Problem d = p;
  d.spec.dtype = dtype;
  d.q = convert(p.q, dtype);
  d.k = convert(p.k, dtype);
  d.v = convert(p.v, dtype);
  d.dout = convert(p.dout, dtype);
  d.bias = convert(p.bias, dtype);
  d.inputs.q = d.q;
  d.inputs.k = d.k;
  d.inputs.v = d.v;
  if (d.bias.defined()) d.inputs.bias = d.bias;
  if (p.sinks.defined()) {  // sink logits are f32, f64 for f64 problems
    d.sinks = convert(p.sinks, d.spec.lse_dtype());
    d.inputs.sinks = d.sinks;
  }
  return d;
}

// FA3's floor: 2 * max |(ref + 0.3 - 0.3) - ref| with each operation rounded to
// `dtype` — the rounding noise of one add at the magnitude of ref's values.
inline double rounding_floor(const Tensor& ref, DType dtype) {
  double m = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double x = element(ref, i);
    if (!std::isfinite(x)) continue;
    double y = x;
    if (dtype == DType::bf16) {
      y = static_cast<float>(detail::bf16_t(static_cast<float>(detail::bf16_t(static_cast<float>(x) + 0.3f)) - 0.3f));
    } else if (dtype == DType::f16) {
      y = static_cast<float>(detail::f16_t(static_cast<float>(detail::f16_t(static_cast<float>(x) + 0.3f)) - 0.3f));
    } else {
      y = static_cast<double>((static_cast<float>(x) + 0.3f) - 0.3f);
    }
    m = std::max(m, std::abs(y - x));
  }
  return 2 * m;
}

struct HalfBaseline {
  PassResults ref;    // f64, outputs/gradients rounded to the input dtype
  PassResults ref64;  // f64, unrounded (for the LSE, which is f32 in every backend)
  PassResults naive;  // same-precision computation
};

inline HalfBaseline half_baseline(const Problem& half, const Problem& as_f64, bool grads) {
  HalfBaseline b;
  b.ref64 = run_backend(*make_reference_backend(), as_f64, grads);
  const DType dt = half.spec.dtype;
  b.ref.out = convert(b.ref64.out, dt);
  b.ref.lse = b.ref64.lse;
  if (grads) {
    b.ref.dq = convert(b.ref64.dq, dt);
    b.ref.dk = convert(b.ref64.dk, dt);
    b.ref.dv = convert(b.ref64.dv, dt);
  }
  b.naive = run_backend(
      *make_reference_backend({.accumulate_f64 = false, .round_intermediates_to_input_dtype = true}), half, grads);
  return b;
}

// `floor_of`: the tensor whose rounding noise is the floor (gradients pass the
// largest of the three, as the f32 tests do: one that cancels to ~0 still
// carries its terms' rounding).
inline void expect_half_within(const std::string& what, const Tensor& x, const Tensor& naive, const Tensor& ref,
                               double c, DType dtype, const Tensor* floor_of = nullptr) {
  const double err = max_abs_diff(x, ref), err_naive = max_abs_diff(naive, ref);
  const double atol = rounding_floor(floor_of ? *floor_of : ref, dtype);
  EXPECT_LE(err, c * err_naive + atol) << what << " (" << to_string(dtype) << "): err " << err
                                       << ", naive same-precision err " << err_naive << ", atol " << atol;
}

// Checks out and lse (C = 2) and, with gradients, dq/dk/dv (C = 3).
inline void expect_half_results(const PassResults& got, const HalfBaseline& b, DType dtype, bool grads) {
  expect_half_within("out", got.out, b.naive.out, b.ref.out, 2, dtype);
  // LSE is f32 everywhere: its floor is f32's, at the LSE's magnitude.
  expect_half_within("lse", got.lse, b.naive.lse, b.ref.lse, 2, DType::f32);
  if (!grads) return;
  const Tensor* largest = &b.ref.dq;
  for (const Tensor* t : {&b.ref.dk, &b.ref.dv}) {
    if (max_abs(*t) > max_abs(*largest)) largest = t;
  }
  expect_half_within("dq", got.dq, b.naive.dq, b.ref.dq, 3, dtype, largest);
  expect_half_within("dk", got.dk, b.naive.dk, b.ref.dk, 3, dtype, largest);
  expect_half_within("dv", got.dv, b.naive.dv, b.ref.dv, 3, dtype, largest);
  // dsinks is f32, formed from O and dO in the input dtype: that dtype's floor.
  if (b.ref.dsinks.defined()) expect_half_within("dsinks", got.dsinks, b.naive.dsinks, b.ref.dsinks, 3, dtype);
}

// spec.dq_dtype = f32 on a bf16/f16 problem: dq comes back in f32, is the
// unrounded sum whose rounding is bit for bit the default run's dq (dk, dv and
// the forward unchanged), and carries bits the input dtype cannot hold. (Its
// distance to the f64 reference is not always smaller: the backward reads the
// rounded output O, whose error dominates dQ's at these sizes.)
inline void expect_f32_dq_is_the_unrounded_default(const Backend& backend, const Problem& half) {
  const DType dt = half.spec.dtype;
  const PassResults def = run_backend(backend, half, true);
  Problem wide_dq = half;
  wide_dq.spec.dq_dtype = DType::f32;
  const PassResults got = run_backend(backend, wide_dq, true);
  ASSERT_EQ(got.dq.view().dtype, DType::f32);
  EXPECT_EQ(got.dk.view().dtype, dt);
  EXPECT_TRUE(bitwise_equal(got.out, def.out));
  EXPECT_TRUE(bitwise_equal(convert(got.dq, dt), def.dq)) << to_string(dt);
  EXPECT_TRUE(bitwise_equal(got.dk, def.dk));
  EXPECT_TRUE(bitwise_equal(got.dv, def.dv));
  if (got.dq.numel() == 0) return;
  EXPECT_FALSE(bitwise_equal(convert(convert(got.dq, dt), DType::f32), got.dq)) << "dq holds no more than " << to_string(dt);
}

}  // namespace attend::testing
