// The reference forward against independent computations (FlashAttention's
// documented examples, naive loops, statistics), plus the properties other
// backends rely on: determinism across thread counts, layout independence,
// precision of the f32 paths and the reasons check() gives.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "reference_test_util.h"

namespace {

using namespace reftest;
constexpr double kInf = std::numeric_limits<double>::infinity();

AttentionSpec spec_of(std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t h, std::int64_t hkv,
                      std::int64_t dqk, std::int64_t dv) {
  AttentionSpec s;
  s.batch = b, s.seqlen_q = sq, s.seqlen_kv = sk, s.heads_q = h, s.heads_kv = hkv;
  s.head_dim_qk = dqk, s.head_dim_v = dv, s.dtype = DType::f64;
  return s;
}

// q = 0 makes every visible logit equal, and v_j = e_j makes out_i = P_i: the
// output row shows exactly which keys row i sees, each with weight 1/count.
Fwd probabilities_of(const AttentionSpec& s) {
  Problem p = make_problem(Case{s});
  std::fill_n(p.q.as<double>(), p.q.numel(), 0.0);
  std::fill_n(p.v.as<double>(), p.v.numel(), 0.0);
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t j = 0; j < s.seqlen_kv; ++j)
      for (std::int64_t h = 0; h < s.heads_kv; ++h) p.v.as<double>()[offset(p.v, s.layout, b, j, h, j)] = 1.0;
  return run_forward(*attend::make_reference_backend(), p);
}

void expect_visible_pattern(const AttentionSpec& s, const std::vector<std::vector<int>>& pattern) {
  const Fwd f = probabilities_of(s);
  for (std::int64_t i = 0; i < s.seqlen_q; ++i) {
    int count = 0;
    for (int x : pattern[i]) count += x;
    for (std::int64_t j = 0; j < s.seqlen_kv; ++j) {
      const double want = pattern[i][j] ? 1.0 / count : 0.0;
      EXPECT_NEAR(f.out.as<double>()[offset(f.out, s.layout, 0, i, 0, j)], want, 1e-15)
          << "row " << i << " col " << j;
    }
    const double lse = f.lse.as<double>()[i];
    if (count == 0)
      EXPECT_EQ(lse, -kInf) << "row " << i;
    else
      EXPECT_NEAR(lse, std::log(static_cast<double>(count)), 1e-14) << "row " << i;
  }
}

TEST(ReferenceSemantics, CausalMaskIsBottomRightAlignedWithFewerQueries) {
  AttentionSpec s = spec_of(1, 2, 5, 1, 1, 4, 5);
  s.causal = true;
  expect_visible_pattern(s, {{1, 1, 1, 1, 0}, {1, 1, 1, 1, 1}});  // FlashAttention README example
}

TEST(ReferenceSemantics, CausalMaskLeavesLeadingRowsEmptyWithMoreQueries) {
  AttentionSpec s = spec_of(1, 5, 2, 1, 1, 4, 2);
  s.causal = true;
  expect_visible_pattern(s, {{0, 0}, {0, 0}, {0, 0}, {1, 0}, {1, 1}});
}

TEST(ReferenceSemantics, SlidingWindowKeepsInclusiveBandAroundAlignedPosition) {
  AttentionSpec s = spec_of(1, 3, 6, 1, 1, 4, 6);  // row i sits at key i + 3
  s.window_left = 1;
  s.window_right = 1;
  expect_visible_pattern(s, {{0, 0, 1, 1, 1, 0}, {0, 0, 0, 1, 1, 1}, {0, 0, 0, 0, 1, 1}});
}

TEST(ReferenceSemantics, FullyMaskedRowsHaveZeroOutputMinusInfLseAndZeroGradients) {
  AttentionSpec s = spec_of(2, 5, 3, 2, 1, 4, 3);
  s.causal = true;  // rows 0 and 1 see no key
  s.has_bias = true;
  s.bias_requires_grad = true;
  Case c{s};
  c.bias_b = 2;
  c.bias_h = 2;
  Problem p = make_problem(c);
  // Row 3 of (b=1, h=0) is masked by the bias alone: all of its logits are -inf.
  double* row3 = p.bias.as<double>() + ((1 * 2 + 0) * 5 + 3) * 3;
  std::fill_n(row3, 3, -kInf);
  const auto be = attend::make_reference_backend();
  const Fwd f = run_forward(*be, p);
  Tensor dout = Tensor::zeros_like(f.out);
  std::mt19937_64 rng(5);
  fill_random(dout, rng, 1.0);
  const Grads g = run_backward(*be, p, f, dout);
  auto expect_masked = [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    EXPECT_EQ(f.lse.as<double>()[(b * 2 + h) * 5 + i], -kInf) << b << h << i;
    for (std::int64_t d = 0; d < 3; ++d)
      EXPECT_EQ(f.out.as<double>()[offset(f.out, s.layout, b, i, h, d)], 0.0);
    for (std::int64_t d = 0; d < 4; ++d)
      EXPECT_EQ(g.dq.as<double>()[offset(g.dq, s.layout, b, i, h, d)], 0.0);
    for (std::int64_t j = 0; j < 3; ++j) EXPECT_EQ(g.dbias.as<double>()[((b * 2 + h) * 5 + i) * 3 + j], 0.0);
  };
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 2; ++h) expect_masked(b, h, 0), expect_masked(b, h, 1);
  expect_masked(1, 0, 3);
  EXPECT_TRUE(std::isfinite(f.lse.as<double>()[(1 * 2 + 1) * 5 + 3]));  // the other head still sees keys
  for (const Tensor* t : {&g.dk, &g.dv})
    for (std::int64_t e = 0; e < t->numel(); ++e) ASSERT_TRUE(std::isfinite(t->as<double>()[e]));
}

// Output and LSE against naive loops over the full score matrix.
void expect_matches_naive(const Case& c) {
  const Problem p = make_problem(c);
  const Fwd got = run_forward(*attend::make_reference_backend(), p);
  const Fwd want = naive_forward(p);
  EXPECT_LE(max_abs_diff(got.out, want.out), 1e-13);
  for (std::int64_t e = 0; e < want.lse.numel(); ++e) {
    const double a = got.lse.as<double>()[e], b = want.lse.as<double>()[e];
    if (std::isinf(b))
      EXPECT_EQ(a, b) << e;
    else
      EXPECT_NEAR(a, b, 1e-13) << e;
  }
}

TEST(ReferenceSemantics, OutputAndLseMatchIndependentLoopsWithEveryLogitTerm) {
  Case c{spec_of(2, 6, 5, 4, 2, 8, 3)};
  c.spec.causal = true;
  c.spec.window_left = 2;
  c.spec.softcap = 2.0;
  c.spec.scale = 0.9;
  c.spec.alibi = true;
  c.alibi_per_batch = true;
  c.spec.has_bias = true;
  c.bias_b = 1;
  c.bias_h = 4;
  expect_matches_naive(c);
}

TEST(ReferenceSemantics, OutputMatchesIndependentLoopsWithDropoutAndGqaInEveryDenseLayout) {
  for (Layout layout : {Layout::bshd, Layout::bhsd, Layout::sbhd}) {
    Case c{spec_of(2, 4, 7, 6, 2, 5, 6)};
    c.spec.layout = layout;
    c.spec.window_left = 3;
    c.spec.window_right = 0;
    c.spec.dropout_p = 0.4;
    c.spec.dropout_seed = 0xfeedbeefcafeULL;
    c.spec.alibi = true;
    SCOPED_TRACE(std::string(attend::to_string(layout)));
    expect_matches_naive(c);
  }
}

TEST(ReferenceSemantics, DropoutKeepsFractionOneMinusPAndScalesKeptProbabilities) {
  AttentionSpec s = spec_of(1, 256, 256, 2, 2, 4, 256);
  s.dropout_p = 0.3;
  s.dropout_seed = 42;
  const Fwd f = probabilities_of(s);  // out[i][j] = P'_ij = keep_ij / (256 * 0.7)
  const auto mask = attend::detail::DropoutMask::make(s.dropout_seed, s.dropout_p);
  const double kept_value = 1.0 / (256 * (1 - s.dropout_p));
  std::int64_t kept = 0, same_across_heads = 0;
  for (std::int64_t i = 0; i < 256; ++i)
    for (std::int64_t j = 0; j < 256; ++j) {
      const double h0 = f.out.as<double>()[offset(f.out, s.layout, 0, i, 0, j)];
      const double h1 = f.out.as<double>()[offset(f.out, s.layout, 0, i, 1, j)];
      ASSERT_TRUE(h0 == 0.0 || std::abs(h0 - kept_value) < 1e-15) << h0;
      EXPECT_EQ(h0 != 0.0, mask.keep(0, 0, i, j));  // keyed by (seed, b, h, row, col)
      kept += h0 != 0.0;
      same_across_heads += (h0 != 0.0) == (h1 != 0.0);
    }
  const double frac = static_cast<double>(kept) / (256.0 * 256.0);
  EXPECT_NEAR(frac, 1 - s.dropout_p, 0.01);  // sd of the fraction is ~0.0018
  EXPECT_LT(same_across_heads, 256 * 256 * 2 / 3) << "heads must draw independent masks";
}

struct ThreadRun {
  Fwd f;
  Grads g;
};

ThreadRun run_with_threads(const Problem& p, const Tensor& dout, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const auto be = attend::make_reference_backend();
  ThreadRun r{run_forward(*be, p), {}};
  r.g = run_backward(*be, p, r.f, dout);
  omp_set_num_threads(saved);
  return r;
}

TEST(ReferenceSemantics, ResultsAreBitwiseIdenticalAcrossThreadCounts) {
  for (auto [bb, bh] : {std::pair<std::int64_t, std::int64_t>{3, 4}, {1, 4}, {3, 1}, {1, 1}}) {
    Case c{spec_of(3, 40, 48, 4, 2, 16, 16)};  // big enough to be run on a thread team
    c.spec.causal = true;
    c.spec.dropout_p = 0.1;
    c.spec.has_bias = true;
    c.spec.bias_requires_grad = true;
    c.bias_b = bb;
    c.bias_h = bh;
    const Problem p = make_problem(c);
    Tensor dout = zeros(DType::f64, {3, 40, 4, 16});
    std::mt19937_64 rng(3);
    fill_random(dout, rng, 1.0);
    const ThreadRun one = run_with_threads(p, dout, 1);
    for (int threads : {2, 3, 5}) {
      SCOPED_TRACE("bias " + std::to_string(bb) + "x" + std::to_string(bh) + ", threads " +
                   std::to_string(threads));
      const ThreadRun many = run_with_threads(p, dout, threads);
      EXPECT_TRUE(bitwise_equal(one.f.out, many.f.out));
      EXPECT_TRUE(bitwise_equal(one.f.lse, many.f.lse));
      EXPECT_TRUE(bitwise_equal(one.g.dq, many.g.dq));
      EXPECT_TRUE(bitwise_equal(one.g.dk, many.g.dk));
      EXPECT_TRUE(bitwise_equal(one.g.dv, many.g.dv));
      EXPECT_TRUE(bitwise_equal(one.g.dbias, many.g.dbias));
    }
  }
}

// Logical (b, s, h, d) copies between a contiguous bshd tensor and `to`'s layout
// (thd packs sequence b at rows [b*seq, (b+1)*seq)).
Tensor from_bshd(const Tensor& src, const AttentionSpec& to, std::int64_t seq) {
  const auto& sh = src.view().shape;
  Tensor dst = zeros(DType::f64, token_shape(to, seq, sh[0] * seq, sh[2], sh[3]));
  for (std::int64_t b = 0; b < sh[0]; ++b)
    for (std::int64_t s = 0; s < seq; ++s)
      for (std::int64_t h = 0; h < sh[2]; ++h)
        for (std::int64_t d = 0; d < sh[3]; ++d)
          dst.as<double>()[offset(dst, to.layout, b, to.varlen() ? b * seq + s : s, h, d)] =
              src.as<double>()[offset(src, Layout::bshd, b, s, h, d)];
  return dst;
}

Tensor to_bshd(const Tensor& src, const AttentionSpec& from, const Tensor& like, std::int64_t seq) {
  const auto& sh = like.view().shape;
  Tensor dst = Tensor::zeros_like(like);
  for (std::int64_t b = 0; b < sh[0]; ++b)
    for (std::int64_t s = 0; s < seq; ++s)
      for (std::int64_t h = 0; h < sh[2]; ++h)
        for (std::int64_t d = 0; d < sh[3]; ++d)
          dst.as<double>()[offset(dst, Layout::bshd, b, s, h, d)] =
              src.as<double>()[offset(src, from.layout, b, from.varlen() ? b * seq + s : s, h, d)];
  return dst;
}

// A (B, S, H, D) view with `pad` unused (NaN) elements after every head row and
// after every token, so that neither the token nor the batch stride is dense.
TensorView padded_copy(const Tensor& src, std::int64_t pad, Tensor& storage) {
  const auto& sh = src.view().shape;
  const std::int64_t tok = sh[2] * (sh[3] + pad) + pad;
  storage = zeros(DType::f64, {sh[0] * sh[1] * tok});
  std::fill_n(storage.as<double>(), storage.numel(), std::nan(""));
  TensorView v = src.view();
  v.data = storage.data();
  v.strides = {sh[1] * tok, tok, sh[3] + pad, 1};
  for (std::int64_t b = 0; b < sh[0]; ++b)
    for (std::int64_t s = 0; s < sh[1]; ++s)
      for (std::int64_t h = 0; h < sh[2]; ++h)
        for (std::int64_t d = 0; d < sh[3]; ++d)
          v.as<double>()[offset(v, Layout::bshd, b, s, h, d)] =
              src.as<double>()[offset(src, Layout::bshd, b, s, h, d)];
  return v;
}

TEST(ReferenceSemantics, LayoutsAndStridedInputsGiveBitwiseIdenticalResults) {
  Case c{spec_of(2, 5, 6, 4, 2, 6, 3)};
  c.spec.causal = true;
  c.spec.dropout_p = 0.2;
  c.spec.alibi = true;
  c.spec.has_bias = true;
  c.spec.bias_requires_grad = true;
  c.bias_b = 2;
  c.bias_h = 1;
  const Problem base = make_problem(c);
  const auto be = attend::make_reference_backend();
  const Fwd f0 = run_forward(*be, base);
  Tensor dout = Tensor::zeros_like(f0.out);
  std::mt19937_64 rng(11);
  fill_random(dout, rng, 1.0);
  const Grads g0 = run_backward(*be, base, f0, dout);

  for (Layout layout : {Layout::bhsd, Layout::sbhd, Layout::thd}) {
    SCOPED_TRACE(std::string(attend::to_string(layout)));
    Problem p = base;
    p.spec.layout = layout;
    if (layout == Layout::thd) {
      p.spec.total_q = 2 * 5, p.spec.total_kv = 2 * 6;
      p.cu_q = zeros(DType::i32, {3});
      p.cu_kv = zeros(DType::i32, {3});
      for (int b = 0; b < 3; ++b) p.cu_q.as<std::int32_t>()[b] = 5 * b, p.cu_kv.as<std::int32_t>()[b] = 6 * b;
    }
    p.q = from_bshd(base.q, p.spec, 5);
    p.k = from_bshd(base.k, p.spec, 6);
    p.v = from_bshd(base.v, p.spec, 6);
    const Fwd f = run_forward(*be, p);
    const Grads g = run_backward(*be, p, f, from_bshd(dout, p.spec, 5));
    EXPECT_TRUE(bitwise_equal(to_bshd(f.out, p.spec, f0.out, 5), f0.out));
    EXPECT_TRUE(bitwise_equal(to_bshd(g.dq, p.spec, base.q, 5), g0.dq));
    EXPECT_TRUE(bitwise_equal(to_bshd(g.dk, p.spec, base.k, 6), g0.dk));
    EXPECT_TRUE(bitwise_equal(to_bshd(g.dv, p.spec, base.v, 6), g0.dv));
    EXPECT_TRUE(bitwise_equal(g.dbias, g0.dbias));
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t h = 0; h < 4; ++h)
        for (std::int64_t i = 0; i < 5; ++i) {
          const std::int64_t at = layout == Layout::thd ? h * 10 + b * 5 + i : (b * 4 + h) * 5 + i;
          EXPECT_EQ(f.lse.as<double>()[at], f0.lse.as<double>()[(b * 4 + h) * 5 + i]);
        }
  }

  SCOPED_TRACE("strided");
  Tensor sq, sk, sv, sd;
  attend::Inputs in = base.inputs();
  in.q = padded_copy(base.q, 3, sq);
  in.k = padded_copy(base.k, 1, sk);
  in.v = padded_copy(base.v, 2, sv);
  const TensorView strided_dout = padded_copy(dout, 5, sd);
  Fwd f{Tensor::zeros_like(f0.out), Tensor::zeros_like(f0.lse)};
  Scratch wf(*be, base.spec, attend::Pass::forward);
  be->forward(attend::ForwardArgs{base.spec, in, f.out, f.lse, wf.view()});
  Grads g{Tensor::zeros_like(base.q), Tensor::zeros_like(base.k), Tensor::zeros_like(base.v),
          Tensor::zeros_like(base.bias)};
  Scratch wb(*be, base.spec, attend::Pass::backward);
  be->backward(
      attend::BackwardArgs{base.spec, in, f.out, f.lse, strided_dout, g.dq, g.dk, g.dv, g.dbias, wb.view()});
  EXPECT_TRUE(bitwise_equal(f.out, f0.out));
  EXPECT_TRUE(bitwise_equal(f.lse, f0.lse));
  EXPECT_TRUE(bitwise_equal(g.dq, g0.dq));
  EXPECT_TRUE(bitwise_equal(g.dk, g0.dk));
  EXPECT_TRUE(bitwise_equal(g.dv, g0.dv));
  EXPECT_TRUE(bitwise_equal(g.dbias, g0.dbias));
}

// Varlen sequences with bias, ALiBi and causal masks each equal a dense B=1
// problem cut out of the same data: rows and columns are local to the sequence.
TEST(ReferenceSemantics, VarlenSequencesMatchSeparateDenseProblems) {
  Case c{spec_of(3, 5, 4, 2, 1, 4, 3)};
  c.spec.layout = Layout::thd;
  c.spec.total_q = 9, c.spec.total_kv = 7;
  c.cu_q = {0, 3, 3, 8};
  c.cu_kv = {0, 4, 6, 6};  // sequence 1 has no queries, sequence 2 no keys
  c.spec.causal = true;
  c.spec.alibi = true;
  c.alibi_per_batch = true;
  c.spec.has_bias = true;
  c.bias_b = 3;
  c.bias_h = 2;
  const Problem p = make_problem(c);
  const auto be = attend::make_reference_backend();
  const Fwd f = run_forward(*be, p);
  // Sequence 0 (3 queries, 4 keys) as a dense problem.
  Case d{spec_of(1, 3, 4, 2, 1, 4, 3)};
  d.spec.causal = true;
  d.spec.alibi = true;
  d.spec.has_bias = true;
  d.bias_h = 2;
  Problem dp = make_problem(d);
  std::copy_n(p.q.as<double>(), dp.q.numel(), dp.q.as<double>());
  std::copy_n(p.k.as<double>(), dp.k.numel(), dp.k.as<double>());
  std::copy_n(p.v.as<double>(), dp.v.numel(), dp.v.as<double>());
  std::copy_n(p.slopes.as<float>(), 2, dp.slopes.as<float>());
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 4; ++j)
        dp.bias.as<double>()[(h * 3 + i) * 4 + j] = p.bias.as<double>()[(h * 5 + i) * 4 + j];
  const Fwd want = naive_forward(dp);
  for (std::int64_t e = 0; e < want.out.numel(); ++e)
    EXPECT_NEAR(f.out.as<double>()[e], want.out.as<double>()[e], 1e-13);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 3; ++i)
      EXPECT_NEAR(f.lse.as<double>()[h * 9 + i], want.lse.as<double>()[h * 3 + i], 1e-13);
  // Sequence 2 has no keys and packed row 8 belongs to no sequence: zero output, -inf LSE.
  for (std::int64_t row = 3; row < 9; ++row)
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(f.lse.as<double>()[h * 9 + row], -kInf) << row;
      for (std::int64_t dd = 0; dd < 3; ++dd) EXPECT_EQ(f.out.as<double>()[(row * 2 + h) * 3 + dd], 0.0);
    }
}

// With f64 accumulation an f32 problem performs exactly the f64 computation and
// rounds once, so it must equal the rounded f64 result bit for bit.
TEST(ReferenceSemantics, F32PathsAreRoundedF64OrCloseWithoutF64Accumulation) {
  Case c{spec_of(2, 7, 9, 4, 2, 16, 8)};
  c.spec.dtype = DType::f32;
  c.spec.causal = true;
  c.spec.softcap = 3.0;
  c.spec.alibi = true;
  c.spec.dropout_p = 0.15;
  c.spec.has_bias = true;
  c.spec.bias_requires_grad = true;
  c.bias_b = 1;
  c.bias_h = 4;
  const Problem p32 = make_problem(c);
  Problem p64 = p32;
  p64.spec.dtype = DType::f64;
  for (Tensor* t : {&p64.q, &p64.k, &p64.v, &p64.bias}) {
    const Tensor src = *t;
    *t = Tensor::zeros(DType::f64, std::span<const std::int64_t>(src.view().shape.data(), src.view().ndim));
    for (std::int64_t e = 0; e < src.numel(); ++e) t->as<double>()[e] = src.as<float>()[e];
  }
  Tensor dout32 = zeros(DType::f32, {2, 7, 4, 8}), dout64 = zeros(DType::f64, {2, 7, 4, 8});
  std::mt19937_64 rng(8);
  fill_random(dout32, rng, 1.0);
  for (std::int64_t e = 0; e < dout32.numel(); ++e) dout64.as<double>()[e] = dout32.as<float>()[e];

  const auto be = attend::make_reference_backend();
  const Fwd f64 = run_forward(*be, p64);
  const Grads g64 = run_backward(*be, p64, f64, dout64);
  const Fwd f32 = run_forward(*be, p32);
  const Grads g32 = run_backward(*be, p32, f32, dout32);
  attend::ReferenceOptions same_precision;
  same_precision.accumulate_f64 = false;
  const auto be32 = attend::make_reference_backend(same_precision);
  const Fwd h32 = run_forward(*be32, p32);
  const Grads k32 = run_backward(*be32, p32, h32, dout32);

  const std::pair<const Tensor*, const Tensor*> pairs[] = {{&f64.out, &f32.out}, {&f64.lse, &f32.lse},
                                                           {&g64.dq, &g32.dq},   {&g64.dk, &g32.dk},
                                                           {&g64.dv, &g32.dv},   {&g64.dbias, &g32.dbias}};
  const Tensor* low[] = {&h32.out, &h32.lse, &k32.dq, &k32.dk, &k32.dv, &k32.dbias};
  for (int t = 0; t < 6; ++t) {
    const Tensor& ref = *pairs[t].first;
    double scale = 0, err = 0;
    for (std::int64_t e = 0; e < ref.numel(); ++e) {
      const double r = ref.as<double>()[e];
      if (std::isinf(r)) continue;
      ASSERT_EQ(pairs[t].second->as<float>()[e], static_cast<float>(r)) << "tensor " << t << " element " << e;
      scale = std::max(scale, std::abs(r));
      err = std::max(err, std::abs(low[t]->as<float>()[e] - r));
    }
    EXPECT_LE(err, 2e-5 * scale) << "tensor " << t;
    EXPECT_GT(err, 0.0) << "tensor " << t << ": accumulate_f64=false should round differently";
  }
}

// bf16/f16 are computed by upcasting (test_reference_half.cpp); i32 is not an
// attention dtype: validate(spec) rejects it before any backend is asked.
TEST(ReferenceSemantics, IntegerDtypeIsRejectedBeforeAnyKernelRuns) {
  AttentionSpec s = spec_of(1, 4, 4, 1, 1, 8, 8);
  s.dtype = DType::i32;
  const auto be = attend::make_reference_backend();
  Tensor q = zeros(DType::i32, {1, 4, 1, 8}), out = zeros(DType::i32, {1, 4, 1, 8});
  Tensor lse = zeros(DType::f32, {1, 1, 4});
  try {
    be->forward(attend::ForwardArgs{s, attend::Inputs{q, q, q, {}, {}, {}, {}}, out, lse});
    ADD_FAILURE() << "forward ran an i32 problem";
  } catch (const attend::Error& e) {
    EXPECT_EQ(e.code(), attend::ErrorCode::invalid_argument) << e.what();
  }
}

TEST(ReferenceSemantics, TinyScoreBudgetIsDeclinedWithMemoryReasonNamingBothSizes) {
  AttentionSpec s = spec_of(1, 16, 16, 1, 1, 8, 8);  // one f64 16x16 matrix = 2048 bytes
  attend::ReferenceOptions tiny;
  tiny.max_score_bytes = 1000;
  const auto be = attend::make_reference_backend(tiny);
  const attend::Support sup = be->check(s, attend::Pass::forward);
  ASSERT_EQ(sup.reasons.size(), 1u);
  EXPECT_EQ(sup.reasons[0].code, attend::ReasonCode::memory);
  EXPECT_NE(sup.reasons[0].message.find("2048"), std::string::npos) << sup.reasons[0].message;
  EXPECT_NE(sup.reasons[0].message.find("1000"), std::string::npos) << sup.reasons[0].message;
  tiny.max_score_bytes = 2048;
  EXPECT_TRUE(attend::make_reference_backend(tiny)->check(s, attend::Pass::forward).ok());
  s.seqlen_kv = std::int64_t{1} << 62;  // the size itself overflows: still an answer, not a throw
  EXPECT_EQ(be->check(s, attend::Pass::backward).reasons.at(0).code, attend::ReasonCode::memory);
}

}  // namespace
