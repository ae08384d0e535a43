// Bad 8-bit K/V input: a spec, scale tensor or mode that cannot be served is an
// attend::Error naming the field and the value, and training never selects a
// backend for it (the per-pass checks refuse backward with a kv_dtype reason).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "attend/attend.h"
#include "support/kv8_problem.h"

namespace attend {
namespace {

AttentionSpec kv8_spec(DType kv, KVScale layout) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = 3;
  s.seqlen_kv = 40;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 16;
  s.head_dim_v = 16;
  s.dtype = DType::bf16;
  s.kv_dtype = kv;
  s.kv_scale = layout;
  return s;
}

template <typename Fn>
std::string error_field(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.field() + " | " + e.what();
  }
  return "(no error)";
}

TEST(Kv8Spec, FieldsAreCheckedByName) {
  AttentionSpec s = kv8_spec(DType::i8, KVScale::per_token);
  EXPECT_NO_THROW(validate(s));
  s.dtype = DType::f64;  // an f64 problem has no 8-bit cache
  EXPECT_EQ(error_field([&] { validate(s); }).rfind("kv_dtype", 0), 0u);
  s = kv8_spec(DType::i8, KVScale::none);
  s.dtype = DType::fp8_e4m3;  // an 8-bit type for q
  EXPECT_EQ(error_field([&] { validate(s); }).rfind("dtype", 0), 0u);
  s = kv8_spec(DType::bf16, KVScale::per_head);  // scales without an 8-bit kv
  EXPECT_EQ(error_field([&] { validate(s); }).rfind("kv_scale", 0), 0u);
  s = kv8_spec(DType::f16, KVScale::none);  // a different wide type
  EXPECT_EQ(error_field([&] { validate(s); }).rfind("kv_dtype", 0), 0u);
  EXPECT_THROW(parse_kv_scale("per_channel"), Error);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::fp8_e4m3);
  EXPECT_EQ(parse_dtype("int8"), DType::i8);
}

TEST(Kv8Selection, TrainingIsRefusedWithKvDtypeReasonsInferenceRuns) {
  const AttentionSpec s = kv8_spec(DType::fp8_e5m2, KVScale::per_head);
  const std::string why = error_field([&] { (void)select(s, Mode::training); });
  EXPECT_NE(why.find("kv_dtype=fp8_e5m2"), std::string::npos) << why;
  EXPECT_NE(why.find("forward only"), std::string::npos) << why;
  const Selection sel = select(s, Mode::inference);
  const std::string name(sel.backend->name());
  EXPECT_TRUE(name == "decode" || name == "flash") << name;
  // The reference (f64) does not read 8-bit codes: forcing it says so.
  Policy only_ref;
  only_ref.force = "reference";
  const std::string forced = error_field([&] { (void)select(s, Mode::inference, only_ref); });
  EXPECT_NE(forced.find("kv_dtype=fp8_e5m2 is not read by reference"), std::string::npos) << forced;
}

struct Kv8Inputs : ::testing::Test {
  void SetUp() override {
    AttentionSpec s = kv8_spec(DType::i8, KVScale::per_token);
    s.dtype = DType::f32;
    s.kv_dtype.reset();
    s.kv_scale = KVScale::none;
    p = testing::quantize_problem(testing::make_problem(s, 4), DType::bf16, DType::i8, KVScale::per_token, 2);
  }
  std::string run_error() {
    return error_field([&] { (void)forward(p.q8.inputs, p.q8.spec, Mode::inference); });
  }
  testing::Kv8Problem p;
};

TEST_F(Kv8Inputs, BadScaleValuesNameTheElement) {
  EXPECT_EQ(run_error(), "(no error)");
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const float keep = p.v_scale.as<float>()[7];
    p.v_scale.as<float>()[7] = bad;  // (b 0, token 3, kv head 1)
    const std::string e = run_error();
    EXPECT_EQ(e.rfind("v_scale[0][3][1]", 0), 0u) << e;
    EXPECT_NE(e.find("finite and > 0"), std::string::npos) << e;
    p.v_scale.as<float>()[7] = keep;
  }
}

TEST_F(Kv8Inputs, WrongShapeDtypeOrMissingScalesAreNamed) {
  Tensor wrong = Tensor::zeros(DType::f32, {2, 40});
  p.q8.inputs.k_scale = wrong;
  EXPECT_EQ(run_error().rfind("k_scale.shape", 0), 0u) << run_error();
  Tensor f16 = Tensor::zeros(DType::f16, {2, 40, 2});
  p.q8.inputs.k_scale = f16;
  EXPECT_EQ(run_error().rfind("k_scale.dtype", 0), 0u) << run_error();
  p.q8.inputs.k_scale = {};
  EXPECT_EQ(run_error().rfind("k_scale", 0), 0u) << run_error();
  p.q8.inputs.k_scale = p.k_scale;
  // Codes of another 8-bit type than the spec's.
  TensorView k = p.q8.inputs.k;
  k.dtype = DType::fp8_e4m3;
  p.q8.inputs.k = k;
  EXPECT_EQ(run_error().rfind("k.dtype", 0), 0u) << run_error();
}

}  // namespace
}  // namespace attend
