// Bad input: every malformed spec or tensor is an attend::Error naming the field
// and the value — never a crash, never an out-of-bounds read.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attend/attend.h"
#include "attend/spec_fields.h"
#include "support/half_baseline.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::make_problem;

AttentionSpec small_spec() {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = 5;
  s.seqlen_kv = 7;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 8;
  s.head_dim_v = 6;
  return s;
}

// Runs `fn`, expects an attend::Error with `code` whose field() is `field`.
template <typename Fn>
void expect_error(Fn&& fn, ErrorCode code, const std::string& field) {
  try {
    fn();
    ADD_FAILURE() << "expected attend::Error on field " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

void expect_spec_error(AttentionSpec s, const std::string& field, ErrorCode code = ErrorCode::invalid_argument) {
  expect_error([&] { validate(s); }, code, field);
}

TEST(SpecValidation, DefaultAndSmallSpecsAreValid) {
  EXPECT_NO_THROW(validate(AttentionSpec{}));
  EXPECT_NO_THROW(validate(small_spec()));
}

TEST(SpecValidation, ZeroOrNegativeSizesNameTheField) {
  auto s = small_spec();
  s.batch = 0;
  expect_spec_error(s, "batch");
  s = small_spec();
  s.heads_q = 0;
  expect_spec_error(s, "heads_q");
  s = small_spec();
  s.heads_kv = -2;
  expect_spec_error(s, "heads_kv");
  s = small_spec();
  s.head_dim_qk = 0;
  expect_spec_error(s, "head_dim_qk");
  s = small_spec();
  s.head_dim_v = -1;
  expect_spec_error(s, "head_dim_v");
  s = small_spec();
  s.seqlen_q = -1;
  expect_spec_error(s, "seqlen_q");
}

TEST(SpecValidation, HeadsNotDivisibleIsRejected) {
  auto s = small_spec();
  s.heads_q = 6;
  s.heads_kv = 4;
  try {
    validate(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "heads_kv");
    EXPECT_EQ(e.value(), "4");
    EXPECT_NE(std::string(e.what()).find("heads_q=6"), std::string::npos);
  }
}

TEST(SpecValidation, WindowBelowMinusOneIsRejected) {
  auto s = small_spec();
  s.window_left = -2;
  expect_spec_error(s, "window_left");
  s = small_spec();
  s.window_right = -5;
  expect_spec_error(s, "window_right");
  // Users coming from FlashAttention (any negative side = unbounded) are told so.
  try {
    validate(s);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FlashAttention treats any negative value as unbounded; pass -1"),
              std::string::npos)
        << e.what();
  }
}

TEST(SpecValidation, DropoutOutsideUnitIntervalIsRejected) {
  for (double p : {1.0, -0.1, 1.5, std::nan("")}) {
    auto s = small_spec();
    s.dropout_p = p;
    expect_spec_error(s, "dropout_p");
  }
}

TEST(SpecValidation, NonFiniteScaleOrSoftcapIsRejected) {
  for (double x : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto s = small_spec();
    s.scale = x;
    expect_spec_error(s, "scale");
    s = small_spec();
    s.softcap = x;
    expect_spec_error(s, "softcap");
  }
  auto s = small_spec();
  s.softcap = -1.0;
  expect_spec_error(s, "softcap");
}

TEST(SpecValidation, ElementCountsThatOverflowAreRejected) {
  auto s = small_spec();
  s.seqlen_q = std::int64_t{1} << 40;
  s.heads_q = std::int64_t{1} << 20;
  s.heads_kv = 1;
  s.head_dim_qk = 1 << 10;
  EXPECT_THROW(
      {
        try {
          validate(s);
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::overflow) << e.what();
          throw;
        }
      },
      Error);
}

TEST(SpecValidation, BiasGradWithoutBiasIsRejected) {
  auto s = small_spec();
  s.bias_requires_grad = true;
  expect_spec_error(s, "bias_requires_grad");
}

TEST(SpecValidation, Int32IsNotAnAttentionDtype) {
  auto s = small_spec();
  s.dtype = DType::i32;
  expect_spec_error(s, "dtype");
}

TEST(SpecValidation, DqDtypeIsTheInputDtypeOrF32ForHalfInputs) {
  auto s = small_spec();
  s.dq_dtype = DType::f32;  // the dtype itself
  EXPECT_NO_THROW(validate(s));
  for (DType dt : {DType::bf16, DType::f16}) {
    s.dtype = dt;
    s.dq_dtype = DType::f32;
    EXPECT_NO_THROW(validate(s));
    EXPECT_NE(signature(s), [&] {
      auto t = s;
      t.dq_dtype.reset();
      return signature(t);
    }());
    s.dq_dtype = DType::f64;
    expect_spec_error(s, "dq_dtype");
  }
  s.dtype = DType::bf16;
  s.dq_dtype = DType::f16;
  expect_spec_error(s, "dq_dtype");
  s.dtype = DType::f64;
  s.dq_dtype = DType::f32;  // f64 problems keep f64 gradients
  expect_spec_error(s, "dq_dtype");
  s.dq_dtype = DType::i32;
  expect_spec_error(s, "dq_dtype");
}

TEST(InputValidation, DqTensorMustHaveTheDqDtype) {
  auto s = small_spec();
  s.dtype = DType::bf16;
  const auto p = testing::problem_as(make_problem(small_spec(), 1), DType::bf16);
  Tensor out = Tensor::zeros(DType::bf16, {2, 5, 4, 6});
  Tensor lse = Tensor::zeros(DType::f32, {2, 4, 5});
  Tensor dk = Tensor::zeros_like(p.k), dv = Tensor::zeros_like(p.v);
  Tensor dq_half = Tensor::zeros_like(p.q), dq_f32 = Tensor::zeros(DType::f32, {2, 5, 4, 8});
  EXPECT_NO_THROW(validate_backward(BackwardArgs{s, p.inputs, out, lse, out, dq_half, dk, dv, {}}));
  expect_error(
      [&] {
        validate_backward(BackwardArgs{s, p.inputs, out, lse, out, dq_f32, dk, dv, {}});
      },
      ErrorCode::invalid_argument, "dq.dtype");
  s.dq_dtype = DType::f32;
  EXPECT_NO_THROW(validate_backward(BackwardArgs{s, p.inputs, out, lse, out, dq_f32, dk, dv, {}}));
  expect_error(
      [&] {
        validate_backward(BackwardArgs{s, p.inputs, out, lse, out, dq_half, dk, dv, {}});
      },
      ErrorCode::invalid_argument, "dq.dtype");
}

TEST(InputValidation, MatchingTensorsPass) {
  auto p = make_problem(small_spec(), 1);
  EXPECT_NO_THROW(validate_inputs(p.spec, p.inputs));
}

TEST(InputValidation, ShapeMismatchNamesTensorAndDim) {
  auto p = make_problem(small_spec(), 1);
  Inputs in = p.inputs;
  in.k.shape[3] = 9;  // head_dim_qk of k differs from q
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::shape_mismatch, "k.shape[3]");
  in = p.inputs;
  in.v.shape[1] = 6;  // seqlen of v differs from k
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::shape_mismatch, "v.shape[1]");
  in = p.inputs;
  in.q.ndim = 3;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::shape_mismatch, "q.shape");
}

TEST(InputValidation, SinksAreRequiredShapedAndFiniteForLearnableOnly) {
  AttentionSpec s = small_spec();
  s.softmax_type = SoftmaxType::learnable;
  auto p = make_problem(s, 1);
  EXPECT_NO_THROW(validate_inputs(p.spec, p.inputs));
  Inputs in = p.inputs;
  in.sinks = {};
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "sinks");
  Tensor wrong = Tensor::zeros(DType::f32, {p.spec.heads_q + 1});
  in.sinks = wrong;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::shape_mismatch, "sinks.shape[0]");
  Tensor f64 = Tensor::zeros(DType::f64, {p.spec.heads_q});
  in.sinks = f64;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "sinks.dtype");
  Tensor bad = Tensor::zeros(DType::f32, {p.spec.heads_q});
  bad.as<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  in.sinks = bad;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "sinks[1]");
  bad.as<float>()[1] = -std::numeric_limits<float>::infinity();
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "sinks[1]");
  // Given without a learnable softmax: rejected rather than ignored.
  AttentionSpec off = p.spec;
  off.softmax_type = SoftmaxType::off_by_one;
  expect_error([&] { validate_inputs(off, p.inputs); }, ErrorCode::invalid_argument, "sinks");
}

TEST(SpecValidation, SoftmaxTypeParsesByNameAndNamesTheFieldOtherwise) {
  AttentionSpec s;
  set_field(s, *find_spec_field("softmax_type"), "off_by_one");
  EXPECT_EQ(s.softmax_type, SoftmaxType::off_by_one);
  EXPECT_EQ(get_field(s, *find_spec_field("softmax_type")), "off_by_one");
  expect_error([&] { set_field(s, *find_spec_field("softmax_type"), "sink"); }, ErrorCode::invalid_argument,
               "softmax_type");
  EXPECT_NE(signature(s), signature(AttentionSpec{}));
}

TEST(InputValidation, LayoutMismatchIsDetected) {
  auto p = make_problem(small_spec(), 1);  // tensors are bshd
  AttentionSpec s = p.spec;
  s.layout = Layout::bhsd;
  expect_error([&] { validate_inputs(s, p.inputs); }, ErrorCode::shape_mismatch, "q.shape[1]");
}

TEST(InputValidation, OutputShapeMismatchIsDetected) {
  auto p = make_problem(small_spec(), 1);
  Tensor out = Tensor::zeros(DType::f32, {2, 5, 4, 8});  // head_dim_v is 6
  Tensor lse = Tensor::zeros(DType::f32, {2, 4, 5});
  expect_error(
      [&] {
        validate_forward(ForwardArgs{p.spec, p.inputs, out, lse});
      },
      ErrorCode::shape_mismatch, "out.shape[3]");
  Tensor out_ok = Tensor::zeros(DType::f32, {2, 5, 4, 6});
  Tensor lse_bad = Tensor::zeros(DType::f64, {2, 4, 5});
  expect_error(
      [&] {
        validate_forward(ForwardArgs{p.spec, p.inputs, out_ok, lse_bad});
      },
      ErrorCode::invalid_argument, "lse.dtype");
}

TEST(InputValidation, DtypeMismatchIsDetected) {
  auto p = make_problem(small_spec(), 1);
  Inputs in = p.inputs;
  in.v.dtype = DType::f64;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "v.dtype");
}

TEST(InputValidation, NullPointerWithElementsIsRejected) {
  auto p = make_problem(small_spec(), 1);
  Inputs in = p.inputs;
  in.q.data = nullptr;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "q.data");
}

TEST(InputValidation, NonContiguousLastDimOrNegativeStrideIsRejected) {
  auto p = make_problem(small_spec(), 1);
  Inputs in = p.inputs;
  in.k.strides[3] = 2;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "k.strides[3]");
  in = p.inputs;
  in.k.strides[1] = -16;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "k.strides[1]");
}

TEST(InputValidation, StridesWhoseExtentOverflowsAreRejected) {
  auto p = make_problem(small_spec(), 1);
  Inputs in = p.inputs;
  in.q.strides[0] = std::numeric_limits<std::int64_t>::max() - 10;
  EXPECT_THROW(validate_inputs(p.spec, in), Error);
}

TEST(InputValidation, OptionalTensorsMustMatchTheSpecFlags) {
  auto s = small_spec();
  s.has_bias = true;
  auto p = make_problem(s, 1);
  Inputs in = p.inputs;
  in.bias = {};
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "bias");
  AttentionSpec no_bias = p.spec;
  no_bias.has_bias = false;
  expect_error([&] { validate_inputs(no_bias, p.inputs); }, ErrorCode::invalid_argument, "bias");
  in = p.inputs;
  in.bias.shape[2] = 4;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::shape_mismatch, "bias.shape[2]");
  AttentionSpec with_alibi = p.spec;
  with_alibi.alibi = true;
  expect_error([&] { validate_inputs(with_alibi, p.inputs); }, ErrorCode::invalid_argument, "alibi_slopes");
}

TEST(InputValidation, BroadcastBiasShapesAreAccepted) {
  auto s = small_spec();
  s.has_bias = true;
  auto p = make_problem(s, 1);
  Tensor shared = Tensor::zeros(DType::f32, {1, 1, 5, 7});
  Inputs in = p.inputs;
  in.bias = shared;
  EXPECT_NO_THROW(validate_inputs(p.spec, in));
  Tensor bad = Tensor::zeros(DType::f32, {3, 1, 5, 7});
  in.bias = bad;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::shape_mismatch, "bias.shape[0]");
}

class VarlenValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    AttentionSpec s = small_spec();
    s.layout = Layout::thd;
    p = make_problem(s, 1, {3, 0, 5}, {4, 0, 7});
  }
  std::int32_t* cu_q() { return p.cu_q.as<std::int32_t>(); }
  testing::Problem p;
};

TEST_F(VarlenValidation, EmptySequenceIsValid) { EXPECT_NO_THROW(validate_inputs(p.spec, p.inputs)); }

TEST_F(VarlenValidation, CuSeqlensMustStartAtZero) {
  cu_q()[0] = 1;
  expect_error([&] { validate_inputs(p.spec, p.inputs); }, ErrorCode::invalid_argument, "cu_seqlens_q[0]");
}

TEST_F(VarlenValidation, CuSeqlensMustBeMonotonic) {
  cu_q()[2] = 1;  // {0,3,1,8}
  expect_error([&] { validate_inputs(p.spec, p.inputs); }, ErrorCode::invalid_argument, "cu_seqlens_q[2]");
}

TEST_F(VarlenValidation, CuSeqlensMustStayInsideBuffer) {
  AttentionSpec s = p.spec;
  s.seqlen_q = 9;  // allow the longer sequence so that only the buffer bound fails
  cu_q()[3] = 9;   // total_q is 8
  expect_error([&] { validate_inputs(s, p.inputs); }, ErrorCode::invalid_argument, "cu_seqlens_q[3]");
}

TEST_F(VarlenValidation, SequenceLongerThanDeclaredMaximumIsRejected) {
  AttentionSpec s = p.spec;
  s.seqlen_q = 4;  // sequence 2 has 5 tokens
  expect_error([&] { validate_inputs(s, p.inputs); }, ErrorCode::invalid_argument, "cu_seqlens_q[3]");
}

TEST_F(VarlenValidation, CuSeqlensOfWrongLengthOrTypeIsRejected) {
  Inputs in = p.inputs;
  in.cu_seqlens_kv.shape[0] = 3;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::shape_mismatch, "cu_seqlens_kv.shape[0]");
  in = p.inputs;
  in.cu_seqlens_kv.dtype = DType::f32;
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "cu_seqlens_kv.dtype");
  in = p.inputs;
  in.cu_seqlens_q = {};
  expect_error([&] { validate_inputs(p.spec, in); }, ErrorCode::invalid_argument, "cu_seqlens_q");
}

TEST(TensorAllocation, OverflowingShapeIsAnError) {
  constexpr std::int64_t big = std::int64_t{1} << 40;
  EXPECT_THROW((void)Tensor::zeros(DType::f64, {big, big}), Error);
  EXPECT_THROW((void)Tensor::zeros(DType::f32, {-1}), Error);
}

}  // namespace
}  // namespace attend
