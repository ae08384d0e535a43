// The reference backward is the derivative of the reference forward: every
// element of dq, dk, dv (and dbias) is checked against central finite
// differences of L = sum(out * G) in f64, one test per feature.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "reference_test_util.h"

namespace {

using namespace reftest;

AttentionSpec small_spec(std::int64_t sq = 5, std::int64_t sk = 7) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = sq;
  s.seqlen_kv = sk;
  s.heads_q = 2;
  s.heads_kv = 2;
  s.head_dim_qk = 6;
  s.head_dim_v = 5;
  s.dtype = DType::f64;
  return s;
}

double loss(const Backend& be, const Problem& p, const Tensor& g) {
  const Fwd f = run_forward(be, p);
  double l = 0;
  for (std::int64_t i = 0; i < g.numel(); ++i) l += f.out.as<double>()[i] * g.as<double>()[i];
  return l;
}

// Compares `grad` with (L(x+h) - L(x-h)) / 2h for every element of x.
void expect_matches_fd(const Backend& be, const Problem& p, const Tensor& g, const Tensor& x,
                       const Tensor& grad, const char* name) {
  constexpr double h = 1e-6;
  double scale = 0;
  for (std::int64_t e = 0; e < grad.numel(); ++e) scale = std::max(scale, std::abs(grad.as<double>()[e]));
  EXPECT_GT(scale, 1e-3) << name << " is (almost) zero everywhere: the test would be vacuous";
  double worst = 0;
  std::int64_t worst_at = -1;
  for (std::int64_t e = 0; e < x.numel(); ++e) {
    double& xe = x.as<double>()[e];
    const double saved = xe;
    xe = saved + h;
    const double lp = loss(be, p, g);
    xe = saved - h;
    const double lm = loss(be, p, g);
    xe = saved;
    const double err = std::abs((lp - lm) / (2 * h) - grad.as<double>()[e]);
    if (err > worst) worst = err, worst_at = e;
  }
  EXPECT_LE(worst, 1e-6 * scale + 1e-9) << name << "[" << worst_at << "] max |grad| " << scale;
}

void expect_gradients_match_fd(const Case& c) {
  const auto be = attend::make_reference_backend();
  const Problem p = make_problem(c);
  const Fwd f = run_forward(*be, p);
  Tensor g = Tensor::zeros_like(f.out);
  std::mt19937_64 rng(c.seed + 100);
  fill_random(g, rng, 1.0);
  const Grads grads = run_backward(*be, p, f, g);
  expect_matches_fd(*be, p, g, p.q, grads.dq, "dq");
  expect_matches_fd(*be, p, g, p.k, grads.dk, "dk");
  expect_matches_fd(*be, p, g, p.v, grads.dv, "dv");
  if (c.spec.has_bias && c.spec.bias_requires_grad)
    expect_matches_fd(*be, p, g, p.bias, grads.dbias, "dbias");
  if (c.spec.softmax_type == attend::SoftmaxType::learnable)
    expect_matches_fd(*be, p, g, p.sinks, grads.dsinks, "dsinks");
}

TEST(ReferenceGradients, PlainAttentionMatchesFiniteDifferences) {
  expect_gradients_match_fd(Case{small_spec()});
}

TEST(ReferenceGradients, CausalWithFewerQueriesThanKeysMatchesFiniteDifferences) {
  Case c{small_spec(4, 7)};
  c.spec.causal = true;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, CausalWithMoreQueriesThanKeysAndFullyMaskedRowsMatchesFiniteDifferences) {
  Case c{small_spec(7, 4)};  // rows 0..2 see no key
  c.spec.causal = true;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, SlidingWindowMatchesFiniteDifferences) {
  Case c{small_spec(6, 8)};
  c.spec.window_left = 2;
  c.spec.window_right = 1;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, CausalWithLeftWindowMatchesFiniteDifferences) {
  Case c{small_spec(6, 8)};
  c.spec.causal = true;
  c.spec.window_left = 2;
  c.spec.window_right = 3;  // causal forces the right side to 0
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, SoftcapMatchesFiniteDifferences) {
  Case c{small_spec()};
  c.spec.softcap = 0.8;  // small enough that tanh saturates on some logits
  c.spec.scale = 1.3;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, AlibiWithPerHeadSlopesMatchesFiniteDifferences) {
  Case c{small_spec()};
  c.spec.alibi = true;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, AlibiWithPerBatchAndHeadSlopesMatchesFiniteDifferences) {
  Case c{small_spec(7, 4)};
  c.spec.alibi = true;
  c.alibi_per_batch = true;
  expect_gradients_match_fd(c);
}

Case bias_case(std::int64_t bb, std::int64_t bh) {
  Case c{small_spec(4, 5)};
  c.spec.heads_q = 3;
  c.spec.heads_kv = 3;
  c.spec.has_bias = true;
  c.spec.bias_requires_grad = true;
  c.bias_b = bb;
  c.bias_h = bh;
  return c;
}

TEST(ReferenceGradients, FullBiasGradientMatchesFiniteDifferences) {
  expect_gradients_match_fd(bias_case(2, 3));
}
TEST(ReferenceGradients, BiasBroadcastOverBatchSumsGradient) { expect_gradients_match_fd(bias_case(1, 3)); }
TEST(ReferenceGradients, BiasBroadcastOverHeadsSumsGradient) { expect_gradients_match_fd(bias_case(2, 1)); }
TEST(ReferenceGradients, BiasBroadcastOverBatchAndHeadsSumsGradient) {
  expect_gradients_match_fd(bias_case(1, 1));
}

TEST(ReferenceGradients, DropoutWithFixedSeedMatchesFiniteDifferences) {
  Case c{small_spec()};
  c.spec.dropout_p = 0.3;
  c.spec.dropout_seed = 1234;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, GroupedQueryAttentionSumsKvGradientsOverGroup) {
  Case c{small_spec()};
  c.spec.heads_q = 4;
  c.spec.heads_kv = 2;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, MultiQueryAttentionMatchesFiniteDifferences) {
  Case c{small_spec()};
  c.spec.heads_q = 3;
  c.spec.heads_kv = 1;
  expect_gradients_match_fd(c);
}

Case varlen_case() {
  Case c{small_spec()};
  c.spec.layout = Layout::thd;
  c.spec.batch = 3;
  c.spec.seqlen_q = 5;   // max of {3, 0, 5}
  c.spec.seqlen_kv = 4;  // max of {4, 2, 0}
  c.spec.total_q = 9;    // one packed row past cu_q[B] belongs to no sequence
  c.spec.total_kv = 7;
  c.cu_q = {0, 3, 3, 8};
  c.cu_kv = {0, 4, 6, 6};  // sequence 2 has queries but no keys
  return c;
}

TEST(ReferenceGradients, VarlenWithEmptySequencesMatchesFiniteDifferences) {
  expect_gradients_match_fd(varlen_case());
}

TEST(ReferenceGradients, VarlenWithCausalBiasAlibiAndDropoutMatchesFiniteDifferences) {
  Case c = varlen_case();
  c.cu_kv = {0, 2, 4, 7};  // sequence 0: 3 queries, 2 keys -> row 0 fully masked
  c.spec.total_kv = 7;
  c.spec.seqlen_kv = 3;
  c.spec.causal = true;
  c.spec.has_bias = true;
  c.spec.bias_requires_grad = true;
  c.bias_b = 3;
  c.bias_h = 1;
  c.spec.alibi = true;
  c.alibi_per_batch = true;
  c.spec.dropout_p = 0.25;
  c.spec.dropout_seed = 99;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, HeadDimQkLargerThanVMatchesFiniteDifferences) {
  Case c{small_spec(3, 4)};
  c.spec.head_dim_qk = 12;
  c.spec.head_dim_v = 8;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, HeadDimVLargerThanQkMatchesFiniteDifferences) {
  Case c{small_spec(3, 4)};
  c.spec.head_dim_qk = 4;
  c.spec.head_dim_v = 16;
  expect_gradients_match_fd(c);
}

TEST(ReferenceGradients, AllFeaturesCombinedMatchFiniteDifferences) {
  Case c{small_spec(6, 5)};
  c.spec.heads_q = 4;
  c.spec.heads_kv = 2;
  c.spec.causal = true;
  c.spec.window_left = 3;
  c.spec.softcap = 1.5;
  c.spec.alibi = true;
  c.spec.has_bias = true;
  c.spec.bias_requires_grad = true;
  c.bias_b = 1;
  c.bias_h = 4;
  c.spec.dropout_p = 0.2;
  c.spec.dropout_seed = 7;
  c.spec.layout = Layout::bhsd;
  expect_gradients_match_fd(c);
}

}  // namespace

namespace {

// --- attention sinks (softmax_type) ---------------------------------------------

Case sink_case(attend::SoftmaxType type, std::int64_t sq = 5, std::int64_t sk = 7) {
  Case c{small_spec(sq, sk)};
  c.spec.softmax_type = type;
  return c;
}

TEST(ReferenceSinks, ForwardMatchesTheConcatenatedColumnDefinition) {
  for (attend::SoftmaxType type : {attend::SoftmaxType::off_by_one, attend::SoftmaxType::learnable}) {
    Case c = sink_case(type, 7, 4);
    c.spec.causal = true;  // rows 0..2 see no key: O = 0, LSE = the sink logit
    c.spec.heads_q = 4;    // GQA
    const auto be = attend::make_reference_backend();
    const Problem p = make_problem(c);
    const Fwd got = run_forward(*be, p);
    const Fwd want = naive_forward(p);
    EXPECT_LE(max_abs_diff(got.out, want.out), 1e-12) << to_string(type);
    EXPECT_LE(max_abs_diff(got.lse, want.lse), 1e-12) << to_string(type);
    // An empty row's LSE is its head's sink logit, not -inf.
    EXPECT_EQ(got.lse.as<double>()[0], sink_logit(p, 0));
  }
}

TEST(ReferenceSinks, OffByOneRowSumsAreBelowOne) {
  // sum_j P_ij = 1 - exp(-LSE_i): checked through O with v = 1.
  Case c = sink_case(attend::SoftmaxType::off_by_one);
  const auto be = attend::make_reference_backend();
  Problem p = make_problem(c);
  for (std::int64_t i = 0; i < p.v.numel(); ++i) p.v.as<double>()[i] = 1.0;
  const Fwd f = run_forward(*be, p);
  const AttentionSpec& s = c.spec;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t i = 0; i < s.seqlen_q; ++i)
      for (std::int64_t h = 0; h < s.heads_q; ++h) {
        const double lse = f.lse.as<double>()[(b * s.heads_q + h) * s.seqlen_q + i];
        EXPECT_NEAR(f.out.as<double>()[offset(f.out, s.layout, b, i, h, 0)], 1.0 - std::exp(-lse), 1e-14);
      }
}

TEST(ReferenceSinks, LearnableSinkGradientMatchesFiniteDifferences) {
  expect_gradients_match_fd(sink_case(attend::SoftmaxType::learnable));
}

TEST(ReferenceSinks, OffByOneGradientsMatchFiniteDifferences) {
  expect_gradients_match_fd(sink_case(attend::SoftmaxType::off_by_one));
}

TEST(ReferenceSinks, LearnableWithCausalEmptyRowsAndGqaMatchesFiniteDifferences) {
  Case c = sink_case(attend::SoftmaxType::learnable, 7, 4);
  c.spec.causal = true;
  c.spec.heads_q = 4;
  expect_gradients_match_fd(c);
}

TEST(ReferenceSinks, LearnableWithWindowSoftcapAndAlibiMatchesFiniteDifferences) {
  Case c = sink_case(attend::SoftmaxType::learnable, 6, 8);
  c.spec.window_left = 2;
  c.spec.window_right = 1;
  c.spec.softcap = 0.8;
  c.spec.alibi = true;
  expect_gradients_match_fd(c);
}

TEST(ReferenceSinks, LearnableWithDropoutMatchesFiniteDifferences) {
  Case c = sink_case(attend::SoftmaxType::learnable);
  c.spec.dropout_p = 0.3;
  c.spec.dropout_seed = 99;
  expect_gradients_match_fd(c);
}

TEST(ReferenceSinks, LearnableWithMlaHeadDimsAndBiasMatchesFiniteDifferences) {
  Case c = sink_case(attend::SoftmaxType::learnable, 4, 5);
  c.spec.head_dim_qk = 12;  // the (192, 128) shape in small: qk wider than v
  c.spec.head_dim_v = 8;
  c.spec.has_bias = c.spec.bias_requires_grad = true;
  c.bias_b = 1;
  c.bias_h = 2;
  expect_gradients_match_fd(c);
}

TEST(ReferenceSinks, LearnableVarlenMatchesFiniteDifferences) {
  Case c = sink_case(attend::SoftmaxType::learnable);
  c.spec.layout = attend::Layout::thd;
  c.spec.batch = 3;
  c.cu_q = {0, 3, 3, 8};  // the middle sequence has no queries
  c.cu_kv = {0, 4, 6, 11};
  c.spec.total_q = 8;
  c.spec.total_kv = 11;
  c.spec.causal = true;
  expect_gradients_match_fd(c);
}

TEST(ReferenceSinks, AccumulateAddsIntoDsinks) {
  Case c = sink_case(attend::SoftmaxType::learnable);
  const auto be = attend::make_reference_backend();
  const Problem p = make_problem(c);
  const Fwd f = run_forward(*be, p);
  Tensor g = Tensor::zeros_like(f.out);
  std::mt19937_64 rng(7);
  fill_random(g, rng, 1.0);
  const Grads once = run_backward(*be, p, f, g);
  Problem acc_p = p;
  acc_p.spec.accumulate_grads = true;
  Grads twice{
      Tensor::zeros_like(p.q), Tensor::zeros_like(p.k), Tensor::zeros_like(p.v), {}, Tensor::zeros_like(p.sinks)};
  for (std::int64_t h = 0; h < c.spec.heads_q; ++h) twice.dsinks.as<double>()[h] = 0.25;
  Scratch ws(*be, acc_p.spec, attend::Pass::backward);
  be->backward(attend::BackwardArgs{
      acc_p.spec, acc_p.inputs(), f.out, f.lse, g, twice.dq, twice.dk, twice.dv, {}, ws.view(), {}, {}, twice.dsinks});
  for (std::int64_t h = 0; h < c.spec.heads_q; ++h) {
    EXPECT_NEAR(twice.dsinks.as<double>()[h], 0.25 + once.dsinks.as<double>()[h], 1e-14);
  }
}

}  // namespace
