// The unfused OpenBLAS baseline computes attention: its f32 forward and
// gradients match the f64 reference within f32 accuracy, under attend's mask
// rules, GQA and strided layouts; it declines what it does not implement.
#include <gtest/gtest.h>

#include "attend/backends/reference.h"
#include "bench/unfused.h"
#include "support/tensors.h"

namespace {

using attend::AttentionSpec;
using attend::DType;
using attend::Pass;
using attend::Tensor;
using attend::bench::UnfusedAttention;
namespace t = attend::testing;

// Relative to the largest reference magnitude; f32 GEMMs over <= 64 terms stay
// orders of magnitude below this.
constexpr double kTolerance = 1e-4;

AttentionSpec small(std::int64_t sq, std::int64_t sk, std::int64_t hq, std::int64_t hkv, std::int64_t d = 16,
                    std::int64_t dv = 16) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = sq;
  s.seqlen_kv = sk;
  s.heads_q = hq;
  s.heads_kv = hkv;
  s.head_dim_qk = d;
  s.head_dim_v = dv;
  return s;
}

void expect_close(const char* name, const Tensor& got, const Tensor& ref) {
  const double scale = std::max(t::max_abs(ref), 1e-30);
  EXPECT_LE(t::max_abs_diff(got, ref) / scale, kTolerance) << name;
}

// Runs the baseline (forward kept for training, then backward) and the f64
// reference on the same data and compares out, dq, dk, dv.
void expect_matches_reference(const AttentionSpec& spec) {
  const t::Problem p = t::make_problem(spec, 42);
  const t::Problem p64 = t::problem_as_f64(p);
  const t::PassResults ref = t::run_backend(*attend::make_reference_backend(), p64, true);

  UnfusedAttention u(spec);
  const Tensor out = Tensor::zeros_like(p.dout);  // out's shape, f32
  u.forward(p.inputs, out, true);
  const Tensor dq = Tensor::zeros_like(p.q), dk = Tensor::zeros_like(p.k), dv = Tensor::zeros_like(p.v);
  u.backward(p.inputs, p.dout, dq, dk, dv);
  expect_close("out", out, ref.out);
  expect_close("dq", dq, ref.dq);
  expect_close("dk", dk, ref.dk);
  expect_close("dv", dv, ref.dv);

  // Inference (one head's buffer, reused) gives the same output.
  const Tensor out2 = Tensor::zeros_like(out);
  u.forward(p.inputs, out2, false);
  EXPECT_TRUE(t::bitwise_equal(out, out2));
}

TEST(UnfusedAttention, PlainAttentionMatchesReference) { expect_matches_reference(small(24, 40, 2, 2)); }

// One score in all (batch, heads, seqlen 1): the kept-probabilities buffer
// needs one float, which an empty Tensor used to claim it held (numel() 1 at a
// null pointer), so the forward wrote through null (`attend bench --seqlen 1
// --heads 1 --batch 1`).
TEST(UnfusedAttention, SingleScoreProblemAllocatesItsBufferAndMatchesReference) {
  AttentionSpec s = small(1, 1, 1, 1, 8, 8);
  s.batch = 1;
  expect_matches_reference(s);
}

TEST(UnfusedAttention, CausalBottomRightAlignedMatchesReference) {
  AttentionSpec s = small(24, 40, 2, 2);
  s.causal = true;
  expect_matches_reference(s);
}

TEST(UnfusedAttention, CausalWithMoreQueriesThanKeysZeroesFullyMaskedRows) {
  AttentionSpec s = small(40, 24, 2, 2);
  s.causal = true;
  expect_matches_reference(s);
}

TEST(UnfusedAttention, SlidingWindowMatchesReference) {
  AttentionSpec s = small(33, 33, 2, 2);
  s.window_left = 5;
  s.window_right = 3;
  expect_matches_reference(s);
}

TEST(UnfusedAttention, GroupedQueryAttentionSumsKvGradientsOverTheGroup) {
  AttentionSpec s = small(20, 28, 6, 2);
  s.causal = true;
  expect_matches_reference(s);
}

TEST(UnfusedAttention, MultiQueryWithUnequalHeadDimsMatchesReference) {
  expect_matches_reference(small(17, 19, 4, 1, 24, 8));
}

TEST(UnfusedAttention, CustomScaleMatchesReference) {
  AttentionSpec s = small(16, 16, 2, 2);
  s.scale = 0.37;
  expect_matches_reference(s);
}

TEST(UnfusedAttention, BhsdAndSbhdLayoutsAreReadThroughTheirStrides) {
  for (const attend::Layout layout : {attend::Layout::bhsd, attend::Layout::sbhd}) {
    AttentionSpec s = small(18, 22, 4, 2);
    s.layout = layout;
    s.causal = true;
    SCOPED_TRACE(std::string(attend::to_string(layout)));
    expect_matches_reference(s);
  }
}

TEST(UnfusedAttention, DeclinesUnsupportedFeaturesWithOneReasonEach) {
  AttentionSpec s = small(8, 8, 2, 2);
  s.dtype = DType::f64;
  s.softcap = 5.0;
  s.alibi = true;
  s.has_bias = true;
  s.dropout_p = 0.1;
  const attend::Support sup = UnfusedAttention::check(s);
  ASSERT_EQ(sup.reasons.size(), 5u) << sup.to_string();
  EXPECT_NE(sup.to_string().find("softcap"), std::string::npos);
  EXPECT_THROW(UnfusedAttention{s}, attend::Error);
  EXPECT_TRUE(UnfusedAttention::check(small(8, 8, 2, 2)).ok());
}

TEST(UnfusedAttention, BackwardWithoutKeptProbabilitiesIsABadState) {
  const AttentionSpec s = small(8, 8, 2, 2);
  const t::Problem p = t::make_problem(s, 1);
  UnfusedAttention u(s);
  const Tensor out = Tensor::zeros_like(p.dout);
  u.forward(p.inputs, out, false);
  const Tensor dq = Tensor::zeros_like(p.q), dk = Tensor::zeros_like(p.k), dv = Tensor::zeros_like(p.v);
  try {
    u.backward(p.inputs, p.dout, dq, dk, dv);
    FAIL() << "expected attend::Error";
  } catch (const attend::Error& e) {
    EXPECT_EQ(e.code(), attend::ErrorCode::bad_state);
  }
}

TEST(UnfusedAttention, ExtraMemoryIsAScoreMatrixPerThreadForwardAndAllProbabilitiesBackward) {
  const AttentionSpec s = small(24, 40, 3, 3);
  const UnfusedAttention u(s);
  const std::size_t head = 24 * 40 * sizeof(float), threads = static_cast<std::size_t>(u.threads());
  EXPECT_GE(threads, 1u);
  EXPECT_EQ(u.extra_bytes(Pass::forward), head * threads);
  EXPECT_EQ(u.extra_bytes(Pass::backward), head * 2 * 3 + head * threads);
}

}  // namespace
