// The reference backend on bf16/f16 inputs: exact upcasting (the result is the
// f64 computation on the same values, rounded once), and the same-precision
// baseline option that the §3.3 tolerance of every half-precision test uses.
#include <gtest/gtest.h>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "support/half_baseline.h"
#include "support/tensors.h"

namespace attend {
namespace {

AttentionSpec small_spec(DType dtype) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = 37;
  s.seqlen_kv = 53;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 40;
  s.head_dim_v = 24;
  s.causal = true;
  s.softcap = 8;
  s.dtype = dtype;
  return s;
}

class ReferenceHalf : public ::testing::TestWithParam<DType> {};

TEST_P(ReferenceHalf, UpcastResultEqualsF64OnTheSameValuesRoundedOnce) {
  const DType dt = GetParam();
  const testing::Problem p = testing::problem_as(testing::make_problem(small_spec(DType::f32), 3), dt);
  const testing::Problem p64 = testing::problem_as_f64(p);
  const auto ref = make_reference_backend();
  ASSERT_TRUE(ref->check(p.spec, Pass::forward).ok());
  ASSERT_TRUE(ref->check(p.spec, Pass::backward).ok());
  const testing::PassResults got = testing::run_backend(*ref, p, true);
  const testing::PassResults want = testing::run_backend(*ref, p64, true);
  EXPECT_EQ(got.out.view().dtype, dt);
  EXPECT_EQ(got.lse.view().dtype, DType::f32);
  EXPECT_TRUE(testing::bitwise_equal(got.out, testing::convert(want.out, dt)));
  EXPECT_TRUE(testing::bitwise_equal(got.lse, testing::convert(want.lse, DType::f32)));
  EXPECT_TRUE(testing::bitwise_equal(got.dq, testing::convert(want.dq, dt)));
  EXPECT_TRUE(testing::bitwise_equal(got.dk, testing::convert(want.dk, dt)));
  EXPECT_TRUE(testing::bitwise_equal(got.dv, testing::convert(want.dv, dt)));
}

TEST_P(ReferenceHalf, SamePrecisionBaselineErrsMoreThanUpcastingButStaysBounded) {
  const DType dt = GetParam();
  const testing::Problem p = testing::problem_as(testing::make_problem(small_spec(DType::f32), 4), dt);
  const testing::HalfBaseline b = testing::half_baseline(p, testing::problem_as_f64(p), true);
  const testing::PassResults up = testing::run_backend(*make_reference_backend(), p, true);
  for (auto [name, naive, upcast, ref] : {std::tuple{"out", b.naive.out, up.out, b.ref.out},
                                          std::tuple{"dq", b.naive.dq, up.dq, b.ref.dq},
                                          std::tuple{"dk", b.naive.dk, up.dk, b.ref.dk},
                                          std::tuple{"dv", b.naive.dv, up.dv, b.ref.dv}}) {
    const double e_naive = testing::max_abs_diff(naive, ref), e_up = testing::max_abs_diff(upcast, ref);
    EXPECT_GT(e_naive, e_up) << name;
    // Far from garbage: within a few percent of the quantity's scale.
    EXPECT_LT(e_naive, 0.1 * std::max(1.0, testing::max_abs(ref))) << name;
  }
}

TEST_P(ReferenceHalf, F32DqIsTheF64GradientRoundedToF32) {
  const DType dt = GetParam();
  testing::Problem p = testing::problem_as(testing::make_problem(small_spec(DType::f32), 5), dt);
  const auto ref = make_reference_backend();
  testing::expect_f32_dq_is_the_unrounded_default(*ref, p);
  const testing::PassResults want = testing::run_backend(*ref, testing::problem_as_f64(p), true);
  p.spec.dq_dtype = DType::f32;
  const testing::PassResults got = testing::run_backend(*ref, p, true);
  EXPECT_TRUE(testing::bitwise_equal(got.dq, testing::convert(want.dq, DType::f32)));
}

TEST(ReferenceHalfCheck, HalfDtypesAreSupportedInBothPassesAndSaySoAreUpcast) {
  const auto ref = make_reference_backend();
  ReferenceOptions f32_options;
  f32_options.accumulate_f64 = false;
  const auto ref32 = make_reference_backend(f32_options);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      const Support sup = ref->check(small_spec(dt), pass);
      EXPECT_TRUE(sup.ok());
      ASSERT_EQ(sup.notes.size(), 1u);
      EXPECT_EQ(sup.notes[0], "dtype=" + std::string(to_string(dt)) +
                                  ": upcast element by element to f64 (a correctness baseline, not a fast path)");
      const Support sup32 = ref32->check(small_spec(dt), pass);
      ASSERT_EQ(sup32.notes.size(), 1u);
      EXPECT_NE(sup32.notes[0].find("to f32"), std::string::npos) << sup32.notes[0];
    }
    EXPECT_TRUE(ref->check(small_spec(DType::f32), pass).notes.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReferenceHalf, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& param_info) { return std::string(to_string(param_info.param)); });

}  // namespace
}  // namespace attend
