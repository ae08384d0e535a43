// flash behaviour beyond numerics: determinism, strided inputs, declared limits
// and the selector's fallback for what flash does not support.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "support/tensors.h"

namespace attend {
namespace {

// When a run forces an ISA this CPU lacks, every flash test skips (and says so).
AttentionSpec spec(std::int64_t sq, std::int64_t sk, std::int64_t d) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = sq;
  s.seqlen_kv = sk;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = s.head_dim_v = d;
  return s;
}

TEST(FlashBehaviour, ActiveIsaFollowsAttendIsa) {
  const char* forced = std::getenv("ATTEND_ISA");
  if (forced && *forced) {
    EXPECT_EQ(flash_active_isa(), forced);
  } else {
    const std::string_view isa = flash_active_isa();
    EXPECT_TRUE(isa == "avx512amx" || isa == "avx512bf16" || isa == "avx512" || isa == "avx2" || isa == "scalar") << isa;
  }
}

// A row that sees one key has P = exp(s - LSE) = 1 exactly if the backward
// forms s exactly as the forward did, and then D = P dP = dP (rows whose keys
// fit one block take D from the tile), so dS = P (dP - D) and dK are exactly 0.
// A backward whose score sums differ from the forward's in any bit (chunked in
// one pass and not the other) leaves dK nonzero: the strict-rule sweeps saw
// 3.9 x the bound at D = 256 that way, which no baseline test here caught.
TEST(FlashBehaviour, OneKeyRowsGiveZeroKeyGradientAtEveryHeadDim) {
  for (const std::int64_t d : {32, 64, 100, 128, 256, 576}) {
    AttentionSpec s = spec(37, 1, d);
    s.heads_q = 4;
    s.heads_kv = 1;
    s.head_dim_v = std::min<std::int64_t>(d, 128);
    s.scale = 0.477;
    const auto p = testing::make_problem(s, 9);
    const auto got = testing::run_backend(*make_flash_backend(), p, true);
    EXPECT_EQ(testing::max_abs(got.dk), 0.0) << "head dim " << d;
    EXPECT_GT(testing::max_abs(got.dv), 0.0) << "head dim " << d;
  }
}

TEST(FlashBehaviour, BackwardIsBitwiseReproducibleAcrossRuns) {
  AttentionSpec s = spec(150, 190, 64);
  s.causal = true;
  s.dropout_p = 0.1;
  const auto p = testing::make_problem(s, 3);
  auto flash = make_flash_backend();
  const auto first = testing::run_backend(*flash, p, true);
  for (int run = 0; run < 20; ++run) {
    const auto again = testing::run_backend(*flash, p, true);
    ASSERT_TRUE(testing::bitwise_equal(first.out, again.out)) << "run " << run;
    ASSERT_TRUE(testing::bitwise_equal(first.lse, again.lse)) << "run " << run;
    ASSERT_TRUE(testing::bitwise_equal(first.dq, again.dq)) << "run " << run;
    ASSERT_TRUE(testing::bitwise_equal(first.dk, again.dk)) << "run " << run;
    ASSERT_TRUE(testing::bitwise_equal(first.dv, again.dv)) << "run " << run;
  }
}

TEST(FlashBehaviour, DeterministicResultsAreIdenticalAcrossThreadCounts) {
  AttentionSpec s = spec(130, 140, 48);
  s.deterministic = true;
  const auto p = testing::make_problem(s, 4);
  auto flash = make_flash_backend();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = testing::run_backend(*flash, p, true);
  omp_set_num_threads(3);
  const auto three = testing::run_backend(*flash, p, true);
  omp_set_num_threads(saved);
  EXPECT_TRUE(testing::bitwise_equal(one.out, three.out));
  EXPECT_TRUE(testing::bitwise_equal(one.dq, three.dq));
  EXPECT_TRUE(testing::bitwise_equal(one.dk, three.dk));
  EXPECT_TRUE(testing::bitwise_equal(one.dv, three.dv));
}

TEST(FlashBehaviour, StridedInputsGiveTheSameResultAsContiguous) {
  const AttentionSpec s = spec(70, 90, 40);
  const auto p = testing::make_problem(s, 5);
  // q with padded rows: each (b, s, h) row sits in a 48-float slot.
  Tensor padded = Tensor::zeros(DType::f32, {2, 70, 4, 48});
  for (std::int64_t r = 0; r < 2 * 70 * 4; ++r) {
    std::copy_n(p.q.as<float>() + r * 40, 40, padded.as<float>() + r * 48);
  }
  testing::Problem strided = p;
  TensorView qv = padded.view();
  qv.shape[3] = 40;
  strided.inputs.q = qv;
  auto flash = make_flash_backend();
  const auto a = testing::run_backend(*flash, p, true);
  strided.q = padded;  // keep alive; the view above is what is read
  const auto b = testing::run_backend(*flash, strided, false);
  EXPECT_TRUE(testing::bitwise_equal(a.out, b.out));
}

TEST(FlashBehaviour, CheckNamesEveryLimit) {
  auto flash = make_flash_backend();
  AttentionSpec s = spec(10, 10, 64);
  s.dtype = DType::f64;
  s.head_dim_qk = 640;
  s.head_dim_v = 640;
  const Support sup = flash->check(s, Pass::forward);
  ASSERT_EQ(sup.reasons.size(), 3u) << sup.to_string();
  EXPECT_EQ(sup.reasons[0].code, ReasonCode::dtype);
  EXPECT_NE(sup.reasons[1].message.find("head_dim_qk=640"), std::string::npos);
  EXPECT_NE(sup.reasons[2].message.find("head_dim_v=640"), std::string::npos);
  AttentionSpec b = spec(10, 10, 64);
  b.has_bias = b.bias_requires_grad = true;
  EXPECT_TRUE(flash->check(b, Pass::forward).ok());
  const Support bwd = flash->check(b, Pass::backward);
  ASSERT_FALSE(bwd.ok());
  EXPECT_EQ(bwd.reasons[0].code, ReasonCode::bias_grad);
}

// With at least 8 (batch, kv head) pairs, or no GQA group to split, backward
// tasks own whole groups and the workspace is per-thread tiles only.
TEST(FlashBehaviour, WorkspaceIsIndependentOfSequenceLength) {
  auto flash = make_flash_backend();
  auto wide = [](std::int64_t sq, std::int64_t sk) {
    AttentionSpec s = spec(sq, sk, 128);
    s.batch = 4;  // 8 pairs
    return s;
  };
  auto mha = [](std::int64_t sq, std::int64_t sk) {
    AttentionSpec s = spec(sq, sk, 128);
    s.batch = 1;
    s.heads_kv = s.heads_q;  // no group
    return s;
  };
  for (Pass pass : {Pass::forward, Pass::backward}) {
    EXPECT_EQ(flash->workspace_bytes(wide(128, 128), pass), flash->workspace_bytes(wide(65536, 65536), pass));
    EXPECT_EQ(flash->workspace_bytes(mha(128, 128), pass), flash->workspace_bytes(mha(65536, 65536), pass));
  }
}

// Fewer pairs than that (B=1 MQA, absorbed MLA): the backward splits each
// group into equal slices of query heads (a divisor of the group, up to 8
// tasks) and holds one f32 dK/dV share per slice, so that both threads work.
TEST(FlashBehaviour, BackwardSplitsAFewHeadGroupWithOneDkDvSharePerSlice) {
  auto flash = make_flash_backend();
  struct Case {
    std::int64_t batch, heads_q, heads_kv, slices;
  };
  for (const Case c : {Case{1, 16, 1, 8}, Case{1, 4, 1, 4}, Case{2, 6, 2, 1}, Case{1, 12, 2, 3}, Case{3, 4, 2, 2}}) {
    auto at = [&](std::int64_t sk) {
      AttentionSpec s = spec(256, sk, 128);
      s.batch = c.batch;
      s.heads_q = c.heads_q;
      s.heads_kv = c.heads_kv;
      s.head_dim_v = 64;
      return s;
    };
    const std::size_t share = sizeof(float) * (128 + 64);  // per key row and slice
    const std::size_t expected =
        c.slices == 1 ? 0 : static_cast<std::size_t>(c.batch * c.heads_kv * c.slices) * share * 1000;
    EXPECT_EQ(flash->workspace_bytes(at(1300), Pass::backward) - flash->workspace_bytes(at(300), Pass::backward),
              expected)
        << c.batch << " " << c.heads_q << "/" << c.heads_kv;
    EXPECT_EQ(flash->workspace_bytes(at(1300), Pass::forward), flash->workspace_bytes(at(300), Pass::forward));
  }
}

// The bf16 backward's dQ sum grows with the (varlen maximum) seqlen_q; a huge
// one must size as "too large" (the allocation then fails as out_of_memory),
// never overflow into a small workspace the kernel would write past.
TEST(FlashBehaviour, HugeSeqlenQWorkspaceSaturatesInsteadOfOverflowing) {
  auto flash = make_flash_backend();
  AttentionSpec s = spec(128, 128, 192);
  s.head_dim_v = 128;
  s.dtype = DType::bf16;
  const AttentionSpec base = s;
  const std::size_t small = flash->workspace_bytes(base, Pass::backward);
  for (const std::int64_t sq : {std::int64_t{44444444444444444}, INT64_MAX}) {
    s.seqlen_q = sq;
    EXPECT_EQ(flash->workspace_bytes(s, Pass::backward), std::numeric_limits<std::size_t>::max()) << sq;
    // The forward's grows with seqlen_kv only (a bf16-GEMM family's packed K/V).
    EXPECT_LT(flash->workspace_bytes(s, Pass::forward), std::size_t{1} << 30);
  }
  EXPECT_LT(small, std::size_t{1} << 30);
}

class FlashSelection : public ::testing::Test {
 protected:
  void SetUp() override {
    Registry::global().reset_to_builtins();
    set_policy(Policy{});
  }
};

TEST_F(FlashSelection, FlashIsPreferredForF32AndReferenceForF64) {
  EXPECT_EQ(select(spec(64, 64, 64), Mode::training).backend->name(), "flash");
  AttentionSpec d = spec(64, 64, 64);
  d.dtype = DType::f64;
  const Selection sel = select(d, Mode::training);
  EXPECT_EQ(sel.backend->name(), "reference");
  EXPECT_NE(sel.explain().find("dtype=f64 is not computed by flash"), std::string::npos);
}

TEST_F(FlashSelection, TrainingWithBiasGradientFallsBackToReferenceWithReason) {
  AttentionSpec s = spec(33, 47, 16);
  s.has_bias = s.bias_requires_grad = true;
  const Selection train = select(s, Mode::training);
  EXPECT_EQ(train.backend->name(), "reference");
  EXPECT_NE(train.explain().find("does not compute dbias"), std::string::npos) << train.explain();
  EXPECT_EQ(select(s, Mode::inference).backend->name(), "flash");
  // The fallback really trains: dbias comes back.
  const auto p = testing::make_problem(s, 6);
  auto fwd = forward(p.inputs, p.spec, Mode::training);
  const Gradients g = backward(fwd.ctx, p.dout);
  EXPECT_TRUE(g.dbias.defined());
  EXPECT_GT(testing::max_abs(g.dbias), 0.0);
}

TEST_F(FlashSelection, MlaTrainingRunsOnFlashEndToEnd) {
  AttentionSpec s = spec(100, 100, 192);
  s.head_dim_v = 128;
  s.causal = true;
  const auto p = testing::make_problem(s, 7);
  auto fwd = forward(p.inputs, p.spec, Mode::training);
  EXPECT_EQ(fwd.ctx.backend().name(), "flash");
  const Gradients g = backward(fwd.ctx, p.dout);
  const auto ref = testing::run_backend(*make_reference_backend(), testing::problem_as_f64(p), true);
  EXPECT_LT(testing::max_abs_diff(g.dq, ref.dq), 1e-4);
  EXPECT_LT(testing::max_abs_diff(g.dk, ref.dk), 1e-4);
  EXPECT_LT(testing::max_abs_diff(g.dv, ref.dv), 1e-4);
}

// The AMX family on emulated tiles is never chosen on its own; ATTEND_ISA (here
// Policy::isa) naming it makes it flash's only variant, and forcing it by name
// runs it too. Where the CPU lacks AVX512-BF16 naming it is an error.
TEST_F(FlashSelection, EmulatedAmxFamilyRunsOnlyWhenAskedFor) {
  AttentionSpec s = spec(64, 64, 64);
  s.dtype = DType::bf16;
  const auto verdict = [](const Selection& sel, std::string_view variant) {
    for (const Verdict& v : sel.verdicts) {
      if (v.backend == "flash" && v.variant == variant) return v;
    }
    ADD_FAILURE() << "no verdict for flash:" << variant;
    return Verdict{};
  };
  const Selection plain = select(s, Mode::training);
  EXPECT_NE(plain.variant_name(), "avx512amx-emu");
  if (!flash_isa_supported("avx512amx-emu")) {
    EXPECT_NE(verdict(plain, "avx512amx-emu").variant_excluded.find("AVX512-BF16"), std::string::npos);
    Policy asked;
    asked.isa = "avx512amx-emu";
    EXPECT_THROW((void)select(s, Mode::training, asked), Error);
    return;
  }
  EXPECT_NE(verdict(plain, "avx512amx-emu").variant_excluded.find("runs only where ATTEND_ISA=avx512amx-emu"),
            std::string::npos);
  Policy asked;
  asked.isa = "avx512amx-emu";
  const Selection emu = select(s, Mode::training, asked);
  ASSERT_EQ(emu.backend->name(), "flash");
  EXPECT_EQ(emu.variant_name(), "avx512amx-emu");
  EXPECT_NE(verdict(emu, "avx512bf16").variant_excluded.find("runs that kernel family alone"), std::string::npos);
  Policy forced;
  forced.force = "flash:avx512amx-emu";
  EXPECT_EQ(select(s, Mode::training, forced).variant_name(), "avx512amx-emu");
  // The process-wide policy decides what a direct call's default target runs.
  set_policy(asked);
  EXPECT_EQ(flash_active_isa(), "avx512amx-emu");
  const auto p = testing::make_problem(s, 8);
  const auto fwd = forward(p.inputs, p.spec, Mode::training);
  EXPECT_EQ(fwd.ctx.backend().name(), "flash");
  set_policy(Policy{});
  EXPECT_NE(flash_active_isa(), "avx512amx-emu");
}

}  // namespace
}  // namespace attend
