// Partial-attention primitives: a problem cut into square chunks with global
// offsets, each chunk pair computed on its own, the forward partials merged
// through their LSEs and the backward accumulated into dq/dk/dv, gives the
// whole problem's result — masks, ALiBi and the dropout mask included. This is
// the identity ring context parallelism relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::make_problem;
using testing::max_abs_diff;
using testing::PassResults;
using testing::Problem;

// Rows [row0, row0 + n) of a bshd tensor (or of a (B, H, S) LSE), as a view.
TensorView rows(const TensorView& t, std::int64_t row0, std::int64_t n, bool lse = false) {
  TensorView v = t;
  const int dim = lse ? 2 : 1;
  v.data = static_cast<std::byte*>(t.data) + row0 * t.strides[dim] * static_cast<std::int64_t>(size_of(t.dtype));
  v.shape[dim] = n;
  return v;
}

struct Case {
  const char* name;
  DType dtype;
  bool causal, alibi, dropout;
  std::int64_t window_left;
  SoftmaxType softmax = SoftmaxType::vanilla;
};

AttentionSpec whole_spec(const Case& c) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = s.seqlen_kv = 40;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 16;
  s.head_dim_v = 12;
  s.dtype = c.dtype;
  s.causal = c.causal;
  s.alibi = c.alibi;
  s.window_left = c.window_left;
  s.softmax_type = c.softmax;
  if (c.dropout) {
    s.dropout_p = 0.2;
    s.dropout_seed = 1234;
  }
  return s;
}

class ChunkedProblem : public ::testing::TestWithParam<Case> {};

// Every (query chunk, key chunk) pair run by `backend` with offsets; forward
// partials merged per query chunk, backward accumulated; compared with the
// whole problem on the f64 reference.
void check_chunks(const Backend& backend, const Case& c, double tol) {
  constexpr std::int64_t kChunk = 10, kChunks = 4;
  const AttentionSpec whole = whole_spec(c);
  const Problem p = make_problem(whole, 7);
  const Problem p64 = testing::problem_as_f64(p);
  const PassResults want = testing::run_backend(*make_reference_backend(), p64, true);

  const AttentionSpec& ws = p.spec;
  Tensor out = testing::token_tensor(ws, ws.seqlen_q, 0, ws.heads_q, ws.head_dim_v, ws.dtype);
  Tensor lse = Tensor::zeros(ws.lse_dtype(), {ws.batch, ws.heads_q, ws.seqlen_q});
  // Partials keep full precision until merged (f64 problems already do).
  const DType part_dtype = ws.dtype == DType::f64 ? DType::f64 : DType::f32;
  Tensor dq = Tensor::zeros_like(p.q), dk = Tensor::zeros_like(p.k), dv = Tensor::zeros_like(p.v);
  Tensor dsinks = Tensor::zeros(ws.lse_dtype(), {ws.heads_q});
  for (std::int64_t qc = 0; qc < kChunks; ++qc) {
    std::vector<Tensor> outs, lses;
    std::vector<Partial> parts;
    AttentionSpec s = ws;
    s.seqlen_q = s.seqlen_kv = kChunk;
    s.q_offset = qc * kChunk;
    for (std::int64_t kc = 0; kc < kChunks; ++kc) {
      s.kv_offset = kc * kChunk;
      if (part_dtype != ws.dtype) s.out_dtype = part_dtype;
      // The sink rule (docs/semantics.md §1a): key chunk 0 carries the sink, the rest run vanilla.
      s.softmax_type = kc == 0 ? ws.softmax_type : SoftmaxType::vanilla;
      Inputs in = p.inputs;
      if (kc != 0) in.sinks = {};
      in.q = rows(p.q, qc * kChunk, kChunk);
      in.k = rows(p.k, kc * kChunk, kChunk);
      in.v = rows(p.v, kc * kChunk, kChunk);
      outs.push_back(Tensor::zeros(part_dtype, {s.batch, kChunk, s.heads_q, s.head_dim_v}));
      lses.push_back(Tensor::zeros(ws.lse_dtype(), {s.batch, s.heads_q, kChunk}));
      backend.forward(ForwardArgs{s, in, outs.back(), lses.back()});
      parts.push_back({outs.back(), lses.back()});
    }
    s.out_dtype.reset();
    merge(s, parts, rows(out, qc * kChunk, kChunk), rows(lse, qc * kChunk, kChunk, true));
  }
  EXPECT_LE(max_abs_diff(out, want.out), tol) << "merged out";
  EXPECT_LE(max_abs_diff(lse, want.lse), tol) << "merged lse";

  // Backward of every pair from the whole problem's out and LSE (no forward
  // context), accumulated: the ring's dQ/dK/dV.
  for (std::int64_t qc = 0; qc < kChunks; ++qc) {
    for (std::int64_t kc = 0; kc < kChunks; ++kc) {
      AttentionSpec s = ws;
      s.seqlen_q = s.seqlen_kv = kChunk;
      s.q_offset = qc * kChunk;
      s.kv_offset = kc * kChunk;
      s.accumulate_grads = true;
      s.softmax_type = kc == 0 ? ws.softmax_type : SoftmaxType::vanilla;
      const bool learnable = s.softmax_type == SoftmaxType::learnable;
      Inputs in = p.inputs;
      if (kc != 0) in.sinks = {};
      in.q = rows(p.q, qc * kChunk, kChunk);
      in.k = rows(p.k, kc * kChunk, kChunk);
      in.v = rows(p.v, kc * kChunk, kChunk);
      backend.backward(BackwardArgs{s,
                                    in,
                                    rows(out, qc * kChunk, kChunk),
                                    rows(lse, qc * kChunk, kChunk, true),
                                    rows(p.dout, qc * kChunk, kChunk),
                                    rows(dq, qc * kChunk, kChunk),
                                    rows(dk, kc * kChunk, kChunk),
                                    rows(dv, kc * kChunk, kChunk),
                                    {},
                                    {},
                                    {},
                                    {},
                                    learnable ? dsinks.view() : TensorView{}});
    }
  }
  EXPECT_LE(max_abs_diff(dq, want.dq), 4 * tol) << "accumulated dq";
  EXPECT_LE(max_abs_diff(dk, want.dk), 4 * tol) << "accumulated dk";
  EXPECT_LE(max_abs_diff(dv, want.dv), 4 * tol) << "accumulated dv";
  if (ws.softmax_type == SoftmaxType::learnable) {
    EXPECT_LE(max_abs_diff(dsinks, want.dsinks), 4 * tol * testing::max_abs(want.dsinks)) << "accumulated dsinks";
  }
}

TEST_P(ChunkedProblem, ReferenceChunksWithOffsetsEqualTheWholeProblem) {
  Case c = GetParam();
  c.dtype = DType::f64;
  check_chunks(*make_reference_backend(), c, 1e-12);
}

TEST_P(ChunkedProblem, FlashChunksWithOffsetsEqualTheWholeProblem) {
  check_chunks(*make_flash_backend(), GetParam(), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ChunkedProblem,
    ::testing::Values(Case{"plain", DType::f32, false, false, false, -1},
                      Case{"causal", DType::f32, true, false, false, -1},
                      Case{"causal_alibi_dropout", DType::f32, true, true, true, -1},
                      Case{"window_alibi", DType::f32, false, true, false, 13},
                      Case{"causal_window_dropout", DType::f32, true, false, true, 17},
                      Case{"causal_learnable_sinks", DType::f32, true, false, false, -1, SoftmaxType::learnable},
                      Case{"window_dropout_learnable_sinks", DType::f32, false, true, true, 13, SoftmaxType::learnable},
                      Case{"causal_off_by_one", DType::f32, true, false, false, -1, SoftmaxType::off_by_one}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(Merge, OnePartIsCopiedAndEmptyRowsStayZeroWithMinusInfinity) {
  AttentionSpec s;
  s.seqlen_q = 3;
  s.heads_q = s.heads_kv = 1;
  s.head_dim_v = 2;
  Tensor a = Tensor::zeros(DType::f32, {1, 3, 1, 2}), la = Tensor::zeros(DType::f32, {1, 1, 3});
  Tensor b = Tensor::zeros(DType::f32, {1, 3, 1, 2}), lb = Tensor::zeros(DType::f32, {1, 1, 3});
  const float inf = std::numeric_limits<float>::infinity();
  // row 0: both parts; row 1: only b; row 2: neither.
  for (int d = 0; d < 2; ++d) {
    a.as<float>()[0 * 2 + d] = 1.0f;
    b.as<float>()[0 * 2 + d] = 3.0f;
    a.as<float>()[1 * 2 + d] = std::numeric_limits<float>::quiet_NaN();  // never read: its weight is 0
    b.as<float>()[1 * 2 + d] = 5.0f;
  }
  la.as<float>()[0] = std::log(1.0f);
  lb.as<float>()[0] = std::log(3.0f);
  la.as<float>()[1] = -inf;
  lb.as<float>()[1] = 0.5f;
  la.as<float>()[2] = lb.as<float>()[2] = -inf;
  const Partial parts[] = {{a, la}, {b, lb}};
  Tensor out = Tensor::zeros(DType::bf16, {1, 3, 1, 2}), lse = Tensor::zeros(DType::f32, {1, 1, 3});
  merge(s, parts, out, lse);
  EXPECT_NEAR(testing::element(out, 0), (1.0 * 1 + 3.0 * 3) / 4, 1e-2);  // weights 1/4, 3/4
  EXPECT_NEAR(lse.as<float>()[0], std::log(4.0f), 1e-6);
  EXPECT_EQ(testing::element(out, 2), 5.0);
  EXPECT_EQ(lse.as<float>()[1], 0.5f);
  EXPECT_EQ(testing::element(out, 4), 0.0);
  EXPECT_EQ(lse.as<float>()[2], -inf);
}

TEST(Merge, NanInAPartsLseMakesItsRowNanAndNoOther) {
  AttentionSpec s;
  s.seqlen_q = 2;
  s.head_dim_v = 1;
  Tensor a = Tensor::zeros(DType::f32, {1, 2, 1, 1}), la = Tensor::zeros(DType::f32, {1, 1, 2});
  la.as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  a.as<float>()[1] = 2.0f;
  const Partial parts[] = {{a, la}};
  Tensor out = Tensor::zeros(DType::f32, {1, 2, 1, 1}), lse = Tensor::zeros(DType::f32, {1, 1, 2});
  merge(s, parts, out, lse);
  EXPECT_TRUE(std::isnan(out.as<float>()[0]));
  EXPECT_TRUE(std::isnan(lse.as<float>()[0]));
  EXPECT_EQ(out.as<float>()[1], 2.0f);
  EXPECT_EQ(lse.as<float>()[1], 0.0f);
}

TEST(Merge, InPlaceAccumulationEqualsMergingAllAtOnce) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = 5;
  s.heads_q = s.heads_kv = 3;
  s.head_dim_v = 4;
  std::vector<Tensor> outs, lses;
  std::vector<Partial> parts;
  for (int k = 0; k < 3; ++k) {
    outs.push_back(Tensor::zeros(DType::f32, {2, 5, 3, 4}));
    lses.push_back(Tensor::zeros(DType::f32, {2, 3, 5}));
    testing::fill_normal(outs.back(), 10 + k);
    testing::fill_normal(lses.back(), 20 + k, 2.0);
    parts.push_back({outs.back(), lses.back()});
  }
  Tensor all = Tensor::zeros(DType::f32, {2, 5, 3, 4}), all_lse = Tensor::zeros(DType::f32, {2, 3, 5});
  merge(s, parts, all, all_lse);
  // acc = merge(acc, part) step by step, in place.
  Tensor acc = testing::convert(outs[0], DType::f32), acc_lse = testing::convert(lses[0], DType::f32);
  for (int k = 1; k < 3; ++k) {
    const Partial step[] = {{acc, acc_lse}, parts[static_cast<std::size_t>(k)]};
    merge(s, step, acc, acc_lse);
  }
  EXPECT_LE(max_abs_diff(acc, all), 1e-5);
  EXPECT_LE(max_abs_diff(acc_lse, all_lse), 1e-5);
}

TEST(Merge, MismatchedShapesAndDtypesAreErrorsNamingTheTensor) {
  AttentionSpec s;
  s.seqlen_q = 4;
  s.head_dim_v = 8;
  Tensor o = Tensor::zeros(DType::f32, {1, 4, 1, 8}), l = Tensor::zeros(DType::f32, {1, 1, 4});
  Tensor bad = Tensor::zeros(DType::f32, {1, 3, 1, 8}), l64 = Tensor::zeros(DType::f64, {1, 1, 4});
  const Partial wrong_shape[] = {{o, l}, {bad, l}};
  try {
    merge(s, wrong_shape, o, l);
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "parts[1].out.shape");
  }
  const Partial wrong_lse[] = {{o, l64}};
  EXPECT_THROW(merge(s, wrong_lse, o, l), Error);
  EXPECT_THROW(merge(s, std::span<const Partial>{}, o, l), Error);
}

// A bf16 forward asked for an f32 out gives the unrounded accumulators: rounded
// to bf16 they are the default bf16 output bit for bit.
TEST(OutDtype, F32PartialOutputRoundsToTheDefaultHalfOutput) {
  for (const auto& backend : {make_flash_backend(), make_reference_backend()}) {
    AttentionSpec s;
    s.batch = 1;
    s.seqlen_q = s.seqlen_kv = 33;
    s.heads_q = s.heads_kv = 2;
    s.head_dim_qk = s.head_dim_v = 32;
    s.dtype = DType::bf16;
    s.causal = true;
    const Problem p = make_problem(s, 3);
    const PassResults plain = testing::run_backend(*backend, p, false);
    AttentionSpec f = p.spec;
    f.out_dtype = DType::f32;
    Tensor out = Tensor::zeros(DType::f32, {1, 33, 2, 32}), lse = Tensor::zeros(DType::f32, {1, 2, 33});
    backend->forward(ForwardArgs{f, p.inputs, out, lse});
    EXPECT_TRUE(testing::bitwise_equal(testing::convert(out, DType::bf16), plain.out)) << backend->name();
    EXPECT_TRUE(testing::bitwise_equal(lse, plain.lse)) << backend->name();
    // backward reads out/dout in the input dtype: an f32 out is declined with the reason.
    EXPECT_TRUE(backend->check(f, Pass::backward).failed(ReasonCode::out_dtype)) << backend->name();
  }
}

TEST(FreeStandingBackward, EqualsTheContextsBackward) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = 17;
  s.seqlen_kv = 29;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = s.head_dim_v = 16;
  s.causal = true;
  const Problem p = make_problem(s, 5);
  const ForwardResult f = forward(p.inputs, p.spec, Mode::training);
  const Gradients g = backward(f.ctx, p.dout);
  const Gradients h = backward(p.spec, p.inputs, f.out, f.lse, p.dout);
  EXPECT_TRUE(testing::bitwise_equal(g.dq, h.dq));
  EXPECT_TRUE(testing::bitwise_equal(g.dk, h.dk));
  EXPECT_TRUE(testing::bitwise_equal(g.dv, h.dv));
  // accumulate_grads adds into the caller's tensors.
  AttentionSpec a = p.spec;
  a.accumulate_grads = true;
  CallOptions o;
  Tensor dq = testing::convert(g.dq, DType::f32), dk = testing::convert(g.dk, DType::f32),
         dv = testing::convert(g.dv, DType::f32);
  o.grads = {dq, dk, dv};
  (void)backward(a, p.inputs, f.out, f.lse, p.dout, o);
  for (std::int64_t i = 0; i < dq.numel(); ++i) EXPECT_NEAR(dq.as<float>()[i], 2 * g.dq.as<float>()[i], 1e-5);
  for (std::int64_t i = 0; i < dv.numel(); ++i) EXPECT_NEAR(dv.as<float>()[i], 2 * g.dv.as<float>()[i], 1e-5);
  // ... and needs them.
  EXPECT_THROW((void)backward(a, p.inputs, f.out, f.lse, p.dout), Error);
}

TEST(Offsets, AreValidatedAndDescribed) {
  AttentionSpec s;
  s.q_offset = -1;
  EXPECT_THROW(validate(s), Error);
  s.q_offset = (std::int64_t{1} << 40) + 1;
  EXPECT_THROW(validate(s), Error);
  s.q_offset = 128;
  s.kv_offset = 64;
  EXPECT_NO_THROW(validate(s));
  EXPECT_NE(describe(s).find("offsets(128,64)"), std::string::npos) << describe(s);
}

}  // namespace
}  // namespace attend
