// The high-level API end to end: forward allocates outputs, backward reuses the
// forward's backend, edge shapes give FlashAttention's documented results.
#include <gtest/gtest.h>

#include <cmath>

#include "attend/attend.h"
#include "support/half_baseline.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::make_problem;

class AttentionApi : public ::testing::Test {
 protected:
  void SetUp() override {
    Registry::global().reset_to_builtins();
    set_policy(Policy{});
  }
};

AttentionSpec varlen_spec() {
  AttentionSpec s;
  s.layout = Layout::thd;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.head_dim_qk = 5;
  s.head_dim_v = 3;
  s.dtype = DType::f64;
  return s;
}

TEST_F(AttentionApi, OutputAndLseHaveDocumentedShapes) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = 3;
  s.seqlen_kv = 4;
  s.heads_q = 2;
  s.head_dim_qk = 8;
  s.head_dim_v = 4;
  s.layout = Layout::sbhd;
  s.heads_kv = 2;
  auto p = make_problem(s, 1);
  auto r = forward(p.inputs, p.spec, Mode::inference);
  EXPECT_EQ(r.out.view().shape_string(), "(3, 2, 2, 4)");
  EXPECT_EQ(r.lse.view().shape_string(), "(2, 2, 3)");
  EXPECT_EQ(r.lse.view().dtype, DType::f32);
}

TEST_F(AttentionApi, VarlenSequenceWithoutKeysGivesZeroOutputNegInfLseAndZeroGrad) {
  auto p = make_problem(varlen_spec(), 2, {3, 2, 0, 4}, {4, 0, 3, 5});
  auto r = forward(p.inputs, p.spec, Mode::training);
  const auto* out = r.out.as<double>();
  const auto* lse = r.lse.as<double>();  // (H, total_q)
  const std::int64_t total_q = p.spec.total_q;
  for (std::int64_t t = 3; t < 5; ++t) {  // rows of sequence 1, which has no keys
    for (std::int64_t h = 0; h < 2; ++h) {
      for (std::int64_t d = 0; d < 3; ++d) EXPECT_EQ(out[(t * 2 + h) * 3 + d], 0.0);
      EXPECT_TRUE(std::isinf(lse[h * total_q + t]) && lse[h * total_q + t] < 0);
    }
  }
  EXPECT_TRUE(std::isfinite(lse[0]));  // sequence 0 row 0 sees keys
  const Gradients g = backward(r.ctx, p.dout);
  for (std::int64_t t = 3; t < 5; ++t) {
    for (std::int64_t i = 0; i < 2 * 5; ++i) EXPECT_EQ(g.dq.as<double>()[t * 10 + i], 0.0);
  }
  for (std::int64_t i = 0; i < g.dq.numel(); ++i) EXPECT_TRUE(std::isfinite(g.dq.as<double>()[i]));
}

TEST_F(AttentionApi, DenseEmptyKeysGiveZeroOutput) {
  AttentionSpec s;
  s.seqlen_q = 3;
  s.seqlen_kv = 0;
  s.head_dim_qk = s.head_dim_v = 4;
  auto p = make_problem(s, 3);
  auto r = forward(p.inputs, p.spec, Mode::training);
  for (std::int64_t i = 0; i < r.out.numel(); ++i) EXPECT_EQ(r.out.as<float>()[i], 0.0f);
  for (std::int64_t i = 0; i < r.lse.numel(); ++i) EXPECT_EQ(r.lse.as<float>()[i], -INFINITY);
  const Gradients g = backward(r.ctx, p.dout);
  for (std::int64_t i = 0; i < g.dq.numel(); ++i) EXPECT_EQ(g.dq.as<float>()[i], 0.0f);
}

TEST_F(AttentionApi, BackwardAllocatesDqInTheRequestedDtype) {
  AttentionSpec s;
  s.seqlen_q = 33;
  s.seqlen_kv = 47;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 16;
  s.head_dim_v = 8;
  s.causal = true;
  const testing::Problem p = testing::problem_as(make_problem(s, 3), DType::bf16);
  AttentionSpec wide = p.spec;
  wide.dq_dtype = DType::f32;
  const ForwardResult f = forward(p.inputs, wide, Mode::training);
  EXPECT_NE(describe(f.ctx.spec()).find("dq=f32"), std::string::npos) << describe(f.ctx.spec());
  const Gradients g = backward(f.ctx, p.dout);
  EXPECT_EQ(g.dq.view().dtype, DType::f32);
  EXPECT_EQ(g.dq.view().shape_string(), p.q.view().shape_string());
  EXPECT_EQ(g.dk.view().dtype, DType::bf16);
  EXPECT_EQ(g.dv.view().dtype, DType::bf16);
  // The same numbers the default run rounds (both runs on the same backend).
  const ForwardResult f_def = forward(p.inputs, p.spec, Mode::training);
  ASSERT_EQ(f_def.ctx.backend().name(), f.ctx.backend().name());
  const Gradients g_def = backward(f_def.ctx, p.dout);
  EXPECT_TRUE(testing::bitwise_equal(testing::convert(g.dq, DType::bf16), g_def.dq));
}

TEST_F(AttentionApi, InferenceContextRefusesBackward) {
  AttentionSpec s;
  s.seqlen_q = s.seqlen_kv = 4;
  auto p = make_problem(s, 4);
  auto r = forward(p.inputs, p.spec, Mode::inference);
  try {
    (void)backward(r.ctx, p.dout);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::bad_state);
    EXPECT_NE(std::string(e.what()).find("Mode::training"), std::string::npos);
  }
  EXPECT_THROW((void)backward(Context{}, p.dout), Error);
}

TEST_F(AttentionApi, BackwardRejectsMismatchedDout) {
  AttentionSpec s;
  s.seqlen_q = s.seqlen_kv = 4;
  auto p = make_problem(s, 5);
  auto r = forward(p.inputs, p.spec, Mode::training);
  Tensor wrong = Tensor::zeros(DType::f32, {1, 4, 1, 32});
  try {
    (void)backward(r.ctx, wrong);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "dout.shape[3]");
  }
}

TEST_F(AttentionApi, ForwardValidatesInputsBeforeSelecting) {
  AttentionSpec s;
  s.seqlen_q = s.seqlen_kv = 4;
  auto p = make_problem(s, 6);
  Inputs in = p.inputs;
  in.k.data = nullptr;
  EXPECT_THROW((void)forward(in, p.spec, Mode::training), Error);
}

}  // namespace
}  // namespace attend
