// The cudnn backend's rule layer (src/backends/cudnn/cudnn_rules.h), without a
// GPU: every reason it can give, per pass, for the architectures and cuDNN
// releases its tables distinguish, and the seed cases of the selector's origin
// (head dims 192/128 and 64/512, training vs inference; cuDNN's own verdicts on
// them are in test_cudnn_deviceless.cpp).
#include <gtest/gtest.h>

#include <string>

#include "attend/attend.h"
#include "backends/cudnn/cudnn_rules.h"
#include "backends/cudnn/cudnn_test_spec.h"

namespace attend {
namespace {

using cudnn::RuleTarget;

constexpr RuleTarget kHopper{90, 91900};      // H100/H200, cuDNN 9.19.0
constexpr RuleTarget kAmpere{80, 91900};      // A100
constexpr RuleTarget kBlackwell{100, 91900};  // B200

AttentionSpec base(std::int64_t dqk = 128, std::int64_t dv = 128) { return testing::cudnn_spec(dqk, dv, 1024, 16); }

AttentionSpec varlen(AttentionSpec s) {
  s.layout = Layout::thd;
  s.total_q = s.batch * s.seqlen_q;
  s.total_kv = s.batch * s.seqlen_kv;
  return s;
}

Support rules(const AttentionSpec& s, Pass pass, RuleTarget t = kHopper) {
  validate(s);  // the rules see only specs the runtime accepts
  Support sup;
  cudnn::check_rules(s, pass, t, sup);
  return sup;
}

// The pass declines with `code`, and one of its reasons of that code contains `text`.
::testing::AssertionResult declines(const AttentionSpec& s, Pass pass, ReasonCode code, const std::string& text,
                                    RuleTarget t = kHopper) {
  const Support sup = rules(s, pass, t);
  if (!sup.failed(code))
    return ::testing::AssertionFailure() << to_string(pass) << " does not fail [" << to_string(code)
                                         << "]: " << sup.to_string();
  for (const Reason& r : sup.reasons)
    if (r.code == code && r.message.find(text) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "no [" << to_string(code) << "] reason mentions '" << text
                                       << "': " << sup.to_string();
}

// A feature set on the base spec and the reason it must give.
struct Case {
  ReasonCode code;
  const char* text;
  void (*set)(AttentionSpec&);
};

::testing::AssertionResult accepts(const AttentionSpec& s, Pass pass, RuleTarget t = kHopper) {
  const Support sup = rules(s, pass, t);
  if (sup.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << to_string(pass) << ": " << sup.to_string();
}

TEST(CudnnRules, HalfDtypesTrainOnEveryArchitectureFromAmpere) {
  for (DType d : {DType::bf16, DType::f16}) {
    AttentionSpec s = base();
    s.dtype = d;
    for (RuleTarget t : {kAmpere, kHopper, kBlackwell}) {
      EXPECT_TRUE(accepts(s, Pass::forward, t));
      EXPECT_TRUE(accepts(s, Pass::backward, t));
    }
  }
}

TEST(CudnnRules, F32AndF64AreDeclinedInBothPasses) {
  for (DType d : {DType::f32, DType::f64}) {
    AttentionSpec s = base();
    s.dtype = d;
    EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::dtype, "dtype=" + std::string(to_string(d))));
    EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::dtype, "bf16/f16"));
  }
}

TEST(CudnnRules, CudnnBefore9AndArchitecturesBeforeAmpereAreDeclined) {
  EXPECT_TRUE(declines(base(), Pass::forward, ReasonCode::library, "cuDNN 8.9.7", RuleTarget{90, 80907}));
  EXPECT_TRUE(declines(base(), Pass::forward, ReasonCode::device, "sm_75", RuleTarget{75, 91900}));
}

TEST(CudnnRules, SeedCase192And128TrainsOnHopperButOnlyInfersOnAmpere) {
  const AttentionSpec s = base(192, 128);
  EXPECT_TRUE(accepts(s, Pass::forward, kHopper));
  EXPECT_TRUE(accepts(s, Pass::backward, kHopper));
  EXPECT_TRUE(accepts(s, Pass::forward, kAmpere));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::head_dim_qk, "exceeds cuDNN's backward limit 128", kAmpere));
  EXPECT_FALSE(rules(s, Pass::backward, kAmpere).failed(ReasonCode::head_dim_v));  // 128 is within it
  // Blackwell: the DeepSeek pair from 9.11 on, beyond its 128 backward limit.
  EXPECT_TRUE(accepts(s, Pass::backward, kBlackwell));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::head_dim_qk, "192", RuleTarget{100, 91002}));
}

// cuDNN 9.19's own verdict (deviceless, for the A100, H100/H200 and B200
// descriptors): MLA's 64/512 and 576/512 run forward, never backward.
TEST(CudnnRules, SeedCase64And512InfersFrom919ButNeverTrains) {
  const AttentionSpec s = base(64, 512);
  for (RuleTarget t : {kAmpere, kHopper, kBlackwell}) {
    EXPECT_TRUE(accepts(s, Pass::forward, t));
    EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::head_dim_v, "head_dim_v=512", t));
    EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::head_dim_v, "forward limit 256", RuleTarget{t.sm, 91801}));
  }
}

TEST(CudnnRules, MlaHeadDims576And512InferFrom919AndDeclineBothDimsBefore) {
  EXPECT_TRUE(accepts(base(576, 512), Pass::forward, kHopper));
  const Support sup = rules(base(576, 512), Pass::forward, RuleTarget{90, 91801});
  EXPECT_TRUE(sup.failed(ReasonCode::head_dim_qk)) << sup.to_string();
  EXPECT_TRUE(sup.failed(ReasonCode::head_dim_v)) << sup.to_string();
  EXPECT_TRUE(declines(base(576, 512), Pass::backward, ReasonCode::head_dim_qk, "backward limit 256"));
  // Only the pairs cuDNN was seen to accept: 512/512 stays beyond the limit.
  EXPECT_TRUE(declines(base(512, 512), Pass::forward, ReasonCode::head_dim_qk, "forward limit 256"));
}

TEST(CudnnRules, HeadDims256ByArchitectureAndRelease) {
  const AttentionSpec s = base(256, 256);
  EXPECT_TRUE(accepts(s, Pass::backward, kHopper));
  EXPECT_TRUE(accepts(s, Pass::forward, kAmpere));
  EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::head_dim_qk, "forward limit 128", RuleTarget{80, 90900}));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::head_dim_qk, "backward limit 128", kAmpere));
  EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::head_dim_v, "forward limit 128", RuleTarget{100, 90800}));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::head_dim_qk, "backward limit 128", kBlackwell));
  EXPECT_TRUE(accepts(s, Pass::backward, RuleTarget{100, 92300}));
}

TEST(CudnnRules, HeadDimsMustBeMultiplesOf8) {
  EXPECT_TRUE(declines(base(100, 128), Pass::forward, ReasonCode::head_dim_qk, "multiple of 8"));
  EXPECT_TRUE(declines(base(128, 36), Pass::backward, ReasonCode::head_dim_v, "multiple of 8"));
}

TEST(CudnnRules, FeaturesNoReleaseComputesAreDeclinedInBothPasses) {
  const Case cases[] = {
      {ReasonCode::softcap, "softcap", [](AttentionSpec& s) { s.softcap = 30; }},
      {ReasonCode::alibi, "own slopes", [](AttentionSpec& s) { s.alibi = true; }},
      {ReasonCode::dropout, "counter rule", [](AttentionSpec& s) { s.dropout_p = 0.1; }},
      {ReasonCode::positions, "q_offset=64",
       [](AttentionSpec& s) {
         s.causal = true;
         s.q_offset = 64;
       }},
      {ReasonCode::out_dtype, "out_dtype=f32", [](AttentionSpec& s) { s.out_dtype = DType::f32; }},
      {ReasonCode::mask, "seqlen_q <= seqlen_kv",
       [](AttentionSpec& s) {
         s.causal = true;
         s.seqlen_kv = 512;
       }},
  };
  for (const Case& c : cases) {
    AttentionSpec s = base();
    c.set(s);
    EXPECT_TRUE(declines(s, Pass::forward, c.code, c.text));
    EXPECT_TRUE(declines(s, Pass::backward, c.code, c.text));
  }
}

TEST(CudnnRules, OffsetsWithoutAMaskChangeNothingAndAreAccepted) {
  AttentionSpec s = base();
  s.q_offset = 64;
  s.kv_offset = 32;
  EXPECT_TRUE(accepts(s, Pass::forward));
  EXPECT_TRUE(accepts(s, Pass::backward));
}

TEST(CudnnRules, BackwardOnlyLimitsLeaveInferenceToCudnn) {
  const Case cases[] = {
      {ReasonCode::dtype, "dq_dtype=f32", [](AttentionSpec& s) { s.dq_dtype = DType::f32; }},
      {ReasonCode::accumulate, "overwrites", [](AttentionSpec& s) { s.accumulate_grads = true; }},
      {ReasonCode::bias_grad, "(1, H, Sq, Sk)",
       [](AttentionSpec& s) {
         s.has_bias = true;
         s.bias_requires_grad = true;
       }},
      {ReasonCode::seqlen, "s_q = s_kv = 1", [](AttentionSpec& s) { s.seqlen_q = s.seqlen_kv = 1; }},
  };
  for (const Case& c : cases) {
    AttentionSpec s = base();
    c.set(s);
    EXPECT_TRUE(accepts(s, Pass::forward));
    EXPECT_TRUE(declines(s, Pass::backward, c.code, c.text));
  }
}

AttentionSpec paged(AttentionSpec s) {
  s.seqlen_q = 1;
  s.kv_page_size = 64;
  return s;
}

TEST(CudnnRules, PagedKvIsForInferenceFrom95) {
  const AttentionSpec s = paged(base());
  EXPECT_TRUE(accepts(s, Pass::forward));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::layout, "takes no page tables"));
  EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::layout, "needs cuDNN 9.5.0", RuleTarget{90, 90400}));
  AttentionSpec left = s;
  left.kv_leftpad = true;
  EXPECT_TRUE(declines(left, Pass::forward, ReasonCode::layout, "cache_leftpad"));
}

TEST(CudnnRules, VarlenOnAmpereNeeds9181AndNoBackward) {
  const AttentionSpec s = varlen(base());
  EXPECT_TRUE(accepts(s, Pass::forward, kHopper));
  EXPECT_TRUE(accepts(s, Pass::backward, kHopper));
  EXPECT_TRUE(accepts(s, Pass::forward, RuleTarget{80, 91801}));
  EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::varlen, "needs cuDNN 9.18.1", RuleTarget{80, 91800}));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::varlen, "ragged LSE", kAmpere));
}

TEST(CudnnRules, VarlenGqaBackwardNeeds96) {
  AttentionSpec s = varlen(base());
  s.heads_kv = 4;
  EXPECT_TRUE(accepts(s, Pass::backward, RuleTarget{90, 90600}));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::gqa, "needs cuDNN 9.6.0", RuleTarget{90, 90500}));
  EXPECT_TRUE(accepts(s, Pass::forward, RuleTarget{90, 90500}));
}

TEST(CudnnRules, GqaAndMqaAreAccepted) {
  for (std::int64_t kv : {4, 1}) {
    AttentionSpec s = base();
    s.heads_kv = kv;
    EXPECT_TRUE(accepts(s, Pass::forward));
    EXPECT_TRUE(accepts(s, Pass::backward));
  }
}

TEST(CudnnRules, BottomRightCausalNeeds96AndTakesNoBias) {
  AttentionSpec s = base();
  s.causal = true;
  s.seqlen_q = 512;
  EXPECT_TRUE(accepts(s, Pass::backward, RuleTarget{90, 90600}));
  EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::mask, "needs cuDNN 9.6.0", RuleTarget{90, 90500}));
  s.has_bias = true;
  EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::bias, "bottom-right"));
  // Equal lengths: the top-left diagonal is the same one, and takes a bias.
  AttentionSpec square = base();
  square.causal = true;
  square.has_bias = true;
  EXPECT_TRUE(accepts(square, Pass::forward, RuleTarget{90, 90000}));
  EXPECT_TRUE(accepts(square, Pass::backward, RuleTarget{90, 90000}));
  // Per-sequence lengths always need the bottom-right alignment, even with Sq > Sk.
  AttentionSpec packed = varlen(base());
  packed.causal = true;
  packed.seqlen_q = 1024;
  packed.seqlen_kv = 512;
  packed = varlen(packed);
  EXPECT_TRUE(accepts(packed, Pass::forward));
  EXPECT_TRUE(declines(packed, Pass::forward, ReasonCode::mask, "bottom-right", RuleTarget{90, 90500}));
}

TEST(CudnnRules, SlidingWindowNeeds9102) {
  AttentionSpec s = base();
  s.window_left = 128;
  EXPECT_TRUE(accepts(s, Pass::forward, RuleTarget{90, 91002}));
  EXPECT_TRUE(accepts(s, Pass::backward, RuleTarget{90, 91002}));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::mask, "window_left=128", RuleTarget{90, 90900}));
  AttentionSpec right = base();
  right.window_right = 16;
  EXPECT_TRUE(declines(right, Pass::forward, ReasonCode::mask, "needs cuDNN 9.10.2", RuleTarget{90, 90900}));
  // causal alone is not a window: any cuDNN 9.
  AttentionSpec causal = base();
  causal.causal = true;
  EXPECT_TRUE(accepts(causal, Pass::forward, RuleTarget{90, 90000}));
}

TEST(CudnnRules, AttentionSinksNeed913AndNoDecodeRow) {
  for (SoftmaxType t : {SoftmaxType::off_by_one, SoftmaxType::learnable}) {
    AttentionSpec s = base();
    s.softmax_type = t;
    EXPECT_TRUE(accepts(s, Pass::forward, RuleTarget{90, 91300}));
    EXPECT_TRUE(accepts(s, Pass::backward, RuleTarget{90, 91300}));
    EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::sinks, "needs cuDNN 9.13.0", RuleTarget{90, 91200}));
    AttentionSpec decode = s;
    decode.seqlen_q = 1;
    EXPECT_TRUE(declines(decode, Pass::forward, ReasonCode::sinks, "seqlen_q=1"));
    const AttentionSpec packed = varlen(s);
    EXPECT_TRUE(accepts(packed, Pass::forward));
    EXPECT_TRUE(declines(packed, Pass::backward, ReasonCode::sinks, "needs cuDNN 9.26.0"));
    EXPECT_TRUE(accepts(packed, Pass::backward, RuleTarget{90, 92600}));
  }
}

TEST(CudnnRules, DeterministicBackwardByArchitecture) {
  AttentionSpec s = base();
  s.deterministic = true;
  EXPECT_TRUE(accepts(s, Pass::backward, kHopper));
  EXPECT_TRUE(accepts(s, Pass::backward, kBlackwell));
  EXPECT_TRUE(declines(s, Pass::backward, ReasonCode::deterministic, "needs cuDNN 9.18.0", RuleTarget{100, 91700}));
  EXPECT_TRUE(accepts(s, Pass::forward, RuleTarget{100, 91700}));
  const AttentionSpec packed = varlen(s);
  EXPECT_TRUE(declines(packed, Pass::backward, ReasonCode::deterministic, "sm_8x", RuleTarget{80, 91900}));
}

TEST(CudnnRules, KnownBadReleasesAreDeclined) {
  EXPECT_TRUE(declines(base(), Pass::forward, ReasonCode::library, "9.10.2", RuleTarget{90, 91000}));
  EXPECT_TRUE(declines(base(), Pass::backward, ReasonCode::library, "known", RuleTarget{90, 91001}));
  AttentionSpec s = base();
  s.seqlen_kv = 2048;
  s.window_left = 256;
  EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::mask, "9.14.1", RuleTarget{90, 91400}));
  EXPECT_TRUE(accepts(s, Pass::forward, RuleTarget{90, 91401}));
}

TEST(CudnnRules, SizesBeyondCudnnsIntegersAreDeclined) {
  AttentionSpec s = base();
  s.batch = 1;
  s.heads_q = s.heads_kv = 1;
  s.seqlen_q = s.seqlen_kv = std::int64_t{1} << 31;
  EXPECT_TRUE(declines(s, Pass::forward, ReasonCode::seqlen, "32-bit"));
  AttentionSpec packed = varlen(base());
  packed.heads_q = packed.heads_kv = 64;
  packed.total_q = packed.total_kv = std::int64_t{1} << 20;
  packed.seqlen_q = packed.seqlen_kv = packed.total_q / packed.batch;
  EXPECT_TRUE(declines(packed, Pass::forward, ReasonCode::seqlen, "ragged offsets"));
}

TEST(CudnnRules, EveryDeclinedPassNamesItsTarget) {
  const Support sup = rules(base(576, 512), Pass::backward, RuleTarget{90, 91900});
  EXPECT_NE(sup.to_string().find("cuDNN 9.19.0 on sm_90"), std::string::npos) << sup.to_string();
}

TEST(CudnnMaskBand, FollowsAttendsBottomRightRule) {
  AttentionSpec s = base();
  EXPECT_FALSE(cudnn::mask_band(s).any);
  s.causal = true;
  cudnn::MaskBand m = cudnn::mask_band(s);
  EXPECT_TRUE(m.any);
  EXPECT_FALSE(m.bottom_right);  // Sq == Sk: top-left is the same diagonal
  EXPECT_EQ(m.right_bound, 0);
  EXPECT_EQ(m.left_bound, -1);
  s.window_left = 3;  // attend keeps j >= i - 3, cuDNN keeps j > i - left_bound
  EXPECT_EQ(cudnn::mask_band(s).left_bound, 4);
  s.seqlen_q = 8;
  EXPECT_TRUE(cudnn::mask_band(s).bottom_right);
  AttentionSpec w = base();
  w.window_right = 5;
  w.window_left = std::int64_t{1} << 40;  // wider than every row: clamped, still exact
  m = cudnn::mask_band(w);
  EXPECT_EQ(m.right_bound, 5);
  EXPECT_EQ(m.left_bound, 2 * 1024 + 1);
  EXPECT_TRUE(cudnn::mask_band(varlen(base())).bottom_right == false);  // no mask, no band
  AttentionSpec packed = varlen(base());
  packed.causal = true;
  EXPECT_TRUE(cudnn::mask_band(packed).bottom_right);
}

TEST(CudnnTarget, ParsesTheAssumedTarget) {
  const RuleTarget a = cudnn::parse_rule_target("sm_90,9.19.0", "ATTEND_CUDNN_TARGET", 91900);
  EXPECT_EQ(a.sm, 90);
  EXPECT_EQ(a.version, 91900);
  const RuleTarget b = cudnn::parse_rule_target("sm80,9.10", "x", 91900);
  EXPECT_EQ(b.sm, 80);
  EXPECT_EQ(b.version, 91000);
  const RuleTarget c = cudnn::parse_rule_target("100,91801", "x", 91900);
  EXPECT_EQ(c.sm, 100);
  EXPECT_EQ(c.version, 91801);
  EXPECT_EQ(cudnn::version_string(91801), "9.18.1");
  const RuleTarget d = cudnn::parse_rule_target("sm_80", "x", 91900);  // the headers' release
  EXPECT_EQ(d.sm, 80);
  EXPECT_EQ(d.version, 91900);
}

TEST(CudnnTarget, MalformedTargetsNameTheVariableAndValue) {
  for (const char* bad : {"", "sm_", "sm_x,9.19.0", "sm_90,9.x", "sm_90,9.19.0.1", "sm_90,9.100.0", "sm_5,9.1"}) {
    try {
      cudnn::parse_rule_target(bad, "ATTEND_CUDNN_TARGET", 91900);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      const std::string what = e.what();
      EXPECT_NE(what.find("ATTEND_CUDNN_TARGET"), std::string::npos) << what;
      EXPECT_NE(what.find(bad), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace attend
