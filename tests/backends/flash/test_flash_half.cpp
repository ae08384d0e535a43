// flash on bf16/f16 inputs, forward and all gradients, against the f64 reference
// with FlashAttention's same-precision-baseline rule (docs/semantics.md §7), on
// odd shapes across features; and, on the conversion paths, exactly the f32
// kernel's result on the widened inputs rounded once (loads widen exactly, all
// math is f32, dQ is accumulated in f32). Runs once per forced ISA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <tuple>
#include <string>
#include <string_view>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "support/conformance_cases.h"
#include "support/half_baseline.h"
#include "support/tensors.h"

namespace attend {
namespace {

struct HalfCase {
  std::string name;
  AttentionSpec spec;
  std::vector<std::int32_t> lens_q, lens_kv;
};

std::ostream& operator<<(std::ostream& os, const HalfCase& c) { return os << c.name; }

AttentionSpec base(std::int64_t sq, std::int64_t sk, std::int64_t dqk, std::int64_t dv) {
  AttentionSpec s;
  s.seqlen_q = sq;
  s.seqlen_kv = sk;
  s.heads_q = 2;
  s.heads_kv = 2;
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  return s;
}

std::vector<HalfCase> cases() {
  std::vector<HalfCase> v;
  v.push_back({"plain_113x203_d64", base(113, 203, 64, 64), {}, {}});
  v.push_back({"d128_300x300", base(300, 300, 128, 128), {}, {}});
  v.push_back({"mla_192_128", base(70, 90, 192, 128), {}, {}});
  v.push_back({"odd_59_111", base(77, 65, 59, 111), {}, {}});
  HalfCase c{"causal_gqa_softcap", base(270, 290, 64, 64), {}, {}};  // two 256-key blocks
  c.spec.causal = true;
  c.spec.heads_q = 4;
  c.spec.softcap = 10;
  c.spec.heads_kv = 2;
  v.push_back(c);
  c = {"window_alibi_bias_dropout", base(90, 120, 72, 40), {}, {}};
  c.spec.window_left = 30;
  c.spec.window_right = 5;
  c.spec.alibi = true;
  c.spec.has_bias = true;
  c.spec.dropout_p = 0.15;
  c.spec.dropout_seed = 5;
  v.push_back(c);
  c = {"varlen_empty_mqa", base(0, 0, 64, 48), {70, 0, 5}, {90, 20, 0}};
  c.spec.layout = Layout::thd;
  c.spec.heads_q = 3;
  c.spec.heads_kv = 1;
  v.push_back(c);
  c = {"mla_absorbed_576_512_mqa_causal", base(40, 50, 576, 512), {}, {}};
  c.spec.heads_q = 4;
  c.spec.heads_kv = 1;
  c.spec.causal = true;
  v.push_back(c);
  c = {"sinks_learnable_causal_gqa", base(90, 70, 64, 64), {}, {}};
  c.spec.heads_q = 4;
  c.spec.causal = true;
  c.spec.softmax_type = SoftmaxType::learnable;
  v.push_back(c);
  c = {"bhsd_causal_sq_above_sk", base(150, 60, 32, 32), {}, {}};
  c.spec.layout = Layout::bhsd;
  c.spec.causal = true;
  v.push_back(c);
  return v;
}

class FlashHalf : public ::testing::TestWithParam<std::tuple<HalfCase, DType>> {};

TEST_P(FlashHalf, ForwardAndGradientsWithinSamePrecisionBaseline) {
  const auto& [c, dt] = GetParam();
  const testing::Problem half = testing::problem_as(testing::make_problem(c.spec, 21, c.lens_q, c.lens_kv), dt);
  const auto flash = make_flash_backend();
  ASSERT_TRUE(flash->check(half.spec, Pass::forward).ok());
  ASSERT_TRUE(flash->check(half.spec, Pass::backward).ok());
  const testing::PassResults got = testing::run_backend(*flash, half, true);
  EXPECT_EQ(got.out.view().dtype, dt);
  EXPECT_EQ(got.dq.view().dtype, dt);
  EXPECT_EQ(got.lse.view().dtype, DType::f32);
  const testing::HalfBaseline b = testing::half_baseline(half, testing::problem_as(half, DType::f64), true);
  testing::expect_half_results(got, b, dt, true);
}

// The conversion paths compute exactly what the f32 kernels compute on the
// widened inputs (the avx512bf16/avx512amx families' bf16 forward GEMMs round
// P to bf16 instead: their accuracy is what the baseline test above checks).
TEST_P(FlashHalf, ConversionPathEqualsF32KernelOnWidenedInputs) {
  const auto& [c, dt] = GetParam();
  const std::string_view isa = flash_active_isa();
  if (dt == DType::bf16 && (isa == "avx512bf16" || isa == "avx512amx" || isa == "avx512amx-emu")) {
    GTEST_SKIP() << "bf16 forward on bf16 GEMMs";
  }
  const testing::Problem half = testing::problem_as(testing::make_problem(c.spec, 22, c.lens_q, c.lens_kv), dt);
  const testing::Problem wide = testing::problem_as(half, DType::f32);
  const auto flash = make_flash_backend();
  const testing::PassResults got = testing::run_backend(*flash, half, true);
  // The f32 backward reads out (and dout) as given: give it the rounded output.
  testing::PassResults f32;
  f32.out = testing::convert(got.out, DType::f32);
  f32.lse = testing::convert(got.lse, DType::f32);
  const testing::PassResults fwd32 = testing::run_backend(*flash, wide, false);
  EXPECT_TRUE(testing::bitwise_equal(got.out, testing::convert(fwd32.out, dt)));
  EXPECT_TRUE(testing::bitwise_equal(got.lse, fwd32.lse));
  f32.dq = Tensor::zeros_like(wide.q);
  f32.dk = Tensor::zeros_like(wide.k);
  f32.dv = Tensor::zeros_like(wide.v);
  if (wide.spec.softmax_type == SoftmaxType::learnable) f32.dsinks = Tensor::zeros(DType::f32, {wide.spec.heads_q});
  flash->backward(BackwardArgs{
      wide.spec, wide.inputs, f32.out, f32.lse, wide.dout, f32.dq, f32.dk, f32.dv, {}, {}, {}, {}, f32.dsinks});
  EXPECT_TRUE(testing::bitwise_equal(got.dq, testing::convert(f32.dq, dt)));
  EXPECT_TRUE(testing::bitwise_equal(got.dk, testing::convert(f32.dk, dt)));
  EXPECT_TRUE(testing::bitwise_equal(got.dv, testing::convert(f32.dv, dt)));
  if (f32.dsinks.defined()) {
    EXPECT_TRUE(testing::bitwise_equal(got.dsinks, f32.dsinks));
  }
}

TEST_P(FlashHalf, F32DqIsTheUnroundedDefault) {
  const auto& [c, dt] = GetParam();
  const testing::Problem half = testing::problem_as(testing::make_problem(c.spec, 23, c.lens_q, c.lens_kv), dt);
  testing::expect_f32_dq_is_the_unrounded_default(*make_flash_backend(), half);
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashHalf,
                         ::testing::Combine(::testing::ValuesIn(cases()), ::testing::Values(DType::bf16, DType::f16)),
                         [](const auto& param_info) {
                           return std::get<0>(param_info.param).name + "_" +
                                  std::string(to_string(std::get<1>(param_info.param)));
                         });

// Every conformance case (tests/conformance runs them in f32) in bf16, where the
// family runs bf16 on its own GEMM kernels: avx512bf16, avx512amx, and the AMX
// kernels on emulated tiles (avx512amx-emu), which is how the AMX family is
// tested on every AVX512-BF16 machine. Elsewhere bf16 takes the conversion
// path, the f32 kernels the conformance suite checks.
class FlashBf16Conformance : public ::testing::TestWithParam<testing::FeatureCase> {};

TEST_P(FlashBf16Conformance, ForwardAndGradientsWithinSamePrecisionBaseline) {
  const std::string_view isa = flash_active_isa();
  if (isa != "avx512bf16" && isa != "avx512amx" && isa != "avx512amx-emu") {
    GTEST_SKIP() << "bf16 on " << isa << " is the f32 kernels' conversion path";
  }
  const testing::FeatureCase& c = GetParam();
  const testing::Problem half =
      testing::problem_as(testing::make_problem(c.spec(31), 23, c.lens_q, c.lens_kv), DType::bf16);
  const auto flash = make_flash_backend();
  ASSERT_TRUE(flash->check(half.spec, Pass::forward).ok());
  const bool grads = flash->check(half.spec, Pass::backward).ok();
  const testing::PassResults got = testing::run_backend(*flash, half, grads);
  const testing::HalfBaseline b = testing::half_baseline(half, testing::problem_as(half, DType::f64), grads);
  testing::expect_half_results(got, b, DType::bf16, grads);
}

INSTANTIATE_TEST_SUITE_P(Conformance, FlashBf16Conformance, ::testing::ValuesIn(testing::conformance_cases()),
                         [](const auto& param_info) { return param_info.param.name; });

// Scores that grow from key block to key block, by less than the lazy max's
// threshold (2^8) in some blocks and far more in others: the bf16 forward's
// reference max then stays for some blocks and moves for others
// (softmax_pairs.h), and O and the LSE must still meet the baseline, causal
// or not.
TEST(FlashHalfLazyMax, GrowingScoresAcrossKeyBlocksMeetTheBaseline) {
  for (const bool causal : {false, true}) {
    AttentionSpec s = base(300, 700, 64, 64);
    s.causal = causal;
    s.heads_q = 4;
    testing::Problem p = testing::make_problem(s, 24);
    // Key j's row scaled by 1 + j / 300: the row maxima (~3 at first) grow
    // ~2 log2 units per 128-key block, so the reference moves every few blocks.
    float* k = p.k.as<float>();
    const std::int64_t row = s.heads_kv * s.head_dim_qk;
    for (std::int64_t j = 0; j < s.seqlen_kv; ++j) {
      for (std::int64_t e = 0; e < row; ++e) k[j * row + e] *= 1.0f + static_cast<float>(j) / 300.0f;
    }
    const testing::Problem half = testing::problem_as(p, DType::bf16);
    const auto flash = make_flash_backend();
    const testing::PassResults got = testing::run_backend(*flash, half, false);
    const testing::HalfBaseline b = testing::half_baseline(half, testing::problem_as(half, DType::f64), false);
    SCOPED_TRACE(causal ? "causal" : "full");
    testing::expect_half_results(got, b, DType::bf16, false);
  }
}

// The raw-score path folds the scale into exp2's exponent and the lazy max's
// growth into score units: scales so small or so large that either overflows
// or vanishes in f32 must still give the reference's answer, as the f32
// kernels do (at 1e-39 the logits are ~0: uniform weights; at 2.5e38 they
// are huge: one key per query).
TEST(FlashHalfLazyMax, ExtremeScalesMeetTheBaseline) {
  for (const double scale : {1e-39, 2.5e38}) {
    AttentionSpec s = base(40, 300, 64, 64);
    s.scale = scale;
    const testing::Problem half = testing::problem_as(testing::make_problem(s, 25), DType::bf16);
    const auto flash = make_flash_backend();
    const testing::PassResults got = testing::run_backend(*flash, half, true);
    const testing::HalfBaseline b = testing::half_baseline(half, testing::problem_as(half, DType::f64), true);
    SCOPED_TRACE(scale);
    testing::expect_half_results(got, b, DType::bf16, true);
  }
}

// Kernels read exactly the rows' elements: NaNs right after each row (where a
// padded pair or a vector tail could reach) change no bit of any result.
TEST(FlashHalfStrided, ValuesBetweenRowsNeverReachResults) {
  for (DType dt : {DType::bf16, DType::f16}) {
    AttentionSpec s = base(70, 90, 40, 24);
    s.batch = 2;
    s.causal = true;
    const testing::Problem dense = testing::problem_as(testing::make_problem(s, 31), dt);
    testing::Problem strided = dense;
    Tensor sq, sk, sv, sdo;
    strided.inputs.q = testing::nan_padded(dense.q, 64, sq);
    strided.inputs.k = testing::nan_padded(dense.k, 64, sk);
    strided.inputs.v = testing::nan_padded(dense.v, 48, sv);
    const auto flash = make_flash_backend();
    const testing::PassResults want = testing::run_backend(*flash, dense, true);
    testing::PassResults got;
    got.out = Tensor::zeros_like(want.out);
    got.lse = Tensor::zeros_like(want.lse);
    flash->forward(ForwardArgs{strided.spec, strided.inputs, got.out, got.lse});
    got.dq = Tensor::zeros_like(dense.q);
    got.dk = Tensor::zeros_like(dense.k);
    got.dv = Tensor::zeros_like(dense.v);
    const TensorView dout = testing::nan_padded(dense.dout, 32, sdo);
    flash->backward(BackwardArgs{strided.spec, strided.inputs, got.out, got.lse, dout, got.dq, got.dk, got.dv, {}});
    for (auto [name, a, b] : {std::tuple{"out", got.out, want.out}, std::tuple{"lse", got.lse, want.lse},
                              std::tuple{"dq", got.dq, want.dq}, std::tuple{"dk", got.dk, want.dk},
                              std::tuple{"dv", got.dv, want.dv}}) {
      EXPECT_TRUE(testing::bitwise_equal(a, b)) << name << " " << to_string(dt);
    }
  }
}

// bf16/f16 backward keeps an f32 dQ sum per thread, O(seqlen_q); with an f32
// dq it accumulates there instead and the workspace is flat in the sequence length.
TEST(FlashHalfWorkspace, F32DqMakesTheBackwardWorkspaceFlat) {
  const auto flash = make_flash_backend();
  for (DType dt : {DType::bf16, DType::f16}) {
    AttentionSpec s = base(1024, 1024, 128, 128);
    s.dtype = dt;
    AttentionSpec longer = s;
    longer.seqlen_q = longer.seqlen_kv = 8192;
    EXPECT_GT(flash->workspace_bytes(longer, Pass::backward), flash->workspace_bytes(s, Pass::backward));
    s.dq_dtype = longer.dq_dtype = DType::f32;
    EXPECT_EQ(flash->workspace_bytes(longer, Pass::backward), flash->workspace_bytes(s, Pass::backward));
  }
}

TEST(FlashHalfCheck, ChecksStateEachDtypeAndPass) {
  const auto flash = make_flash_backend();
  AttentionSpec s = base(64, 64, 64, 64);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    s.dtype = dt;
    EXPECT_TRUE(flash->check(s, Pass::forward).ok()) << to_string(dt);
    EXPECT_TRUE(flash->check(s, Pass::backward).ok()) << to_string(dt);
  }
  s.dtype = DType::f64;
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const Support sup = flash->check(s, pass);
    EXPECT_TRUE(sup.notes.empty());
    ASSERT_EQ(sup.reasons.size(), 1u);
    EXPECT_EQ(sup.reasons[0].code, ReasonCode::dtype);
    EXPECT_NE(sup.reasons[0].message.find("dtype=f64"), std::string::npos) << sup.reasons[0].message;
    EXPECT_NE(sup.reasons[0].message.find("f32, bf16, f16"), std::string::npos) << sup.reasons[0].message;
  }
}

// A half dtype never runs at f32 speed silently: each pass's check says whether
// it runs on bf16 GEMM instructions or widened on the active family's f32 kernels.
TEST(FlashHalfCheck, NotesSayHowEachHalfDtypeRuns) {
  const auto flash = make_flash_backend();
  const std::string isa(flash_active_isa());
  const bool bf16_gemm = isa == "avx512amx" || isa == "avx512bf16" || isa == "avx512amx-emu";
  AttentionSpec s = base(64, 64, 64, 64);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    s.dtype = DType::f32;
    EXPECT_TRUE(flash->check(s, pass).notes.empty());
    for (DType dt : {DType::bf16, DType::f16}) {
      s.dtype = dt;
      const Support sup = flash->check(s, pass);
      ASSERT_EQ(sup.notes.size(), 1u) << to_string(dt);
      const std::string& note = sup.notes[0];
      EXPECT_NE(note.find("dtype=" + std::string(to_string(dt))), std::string::npos) << note;
      EXPECT_NE(note.find("kernel family " + isa), std::string::npos) << note;
      const bool widened = dt == DType::f16 || !bf16_gemm;
      EXPECT_EQ(note.find("widened to f32") != std::string::npos, widened) << note;
      EXPECT_EQ(note.find("GEMMs on") != std::string::npos, !widened) << note;
    }
  }
}

}  // namespace
}  // namespace attend
