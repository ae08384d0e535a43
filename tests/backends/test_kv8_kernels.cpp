// decode and flash over 8-bit K/V (fp8_e4m3, fp8_e5m2, i8) with every scale
// layout, for f32, bf16 and f16 queries: against the f64 reference on the
// dequantized K/V (code * scale) by the same-precision rule, for dense
// (bshd, bhsd, sbhd), varlen and paged caches with GQA, causal and window
// masks, softcap, ALiBi, sinks and dropout. The suite runs once per kernel
// family (tests/CMakeLists.txt), so every family's dequantizing loads run.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/decode.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "backends/decode/paged_problem.h"
#include "support/kv8_problem.h"

namespace attend {
namespace {

struct Kv8Case {
  std::string name;
  AttentionSpec spec;
  std::vector<std::int32_t> lens_q, lens_kv, leftpad;
  std::int64_t page = 0;
};

AttentionSpec base(std::int64_t sq, std::int64_t sk, std::int64_t dqk, std::int64_t dv) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = sq;
  s.seqlen_kv = sk;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  return s;
}

std::vector<Kv8Case> cases() {
  std::vector<Kv8Case> v;
  v.push_back({"decode_one_query", base(1, 700, 64, 64), {}, {}, {}, 0});
  Kv8Case c{"bhsd_causal_softcap_alibi_odd_dims", base(5, 130, 72, 40), {}, {}, {}, 0};
  c.spec.layout = Layout::bhsd;
  c.spec.causal = true;
  c.spec.softcap = 8;
  c.spec.alibi = true;
  v.push_back(c);
  c = {"varlen_window", base(0, 0, 64, 32), {1, 0, 3, 40}, {200, 17, 0, 90}, {}, 0};
  c.spec.layout = Layout::thd;
  c.spec.window_left = 30;
  v.push_back(c);
  c = {"paged_leftpad_causal_sinks", base(3, 0, 64, 64), {}, {300, 90}, {5, 0}, 16};
  c.spec.causal = true;
  c.spec.softmax_type = SoftmaxType::learnable;
  v.push_back(c);
  c = {"sbhd_mqa_dropout_prefill", base(70, 150, 128, 128), {}, {}, {}, 0};
  c.spec.layout = Layout::sbhd;
  c.spec.heads_q = 6;
  c.spec.heads_kv = 1;
  c.spec.dropout_p = 0.2;
  v.push_back(c);
  return v;
}

// The case as an f32 problem (a paged case's pools live in `pages`).
testing::Problem f32_problem(const Kv8Case& c, testing::PagedProblem& pages) {
  if (c.page == 0) return testing::make_problem(c.spec, 17, c.lens_q, c.lens_kv);
  pages = testing::make_paged(c.spec, c.page, c.lens_kv, c.leftpad, 17);
  return testing::paged_as_problem(pages);
}

using Param = std::tuple<Kv8Case, DType, KVScale>;

std::string case_name(const Param& p) {
  return std::get<0>(p).name + "_" + std::string(to_string(std::get<1>(p))) + "_" +
         std::string(to_string(std::get<2>(p)));
}

class Kv8Kernels : public ::testing::TestWithParam<Param> {};

TEST_P(Kv8Kernels, DecodeAndFlashMatchReferenceOnDequantizedKV) {
  const auto& [c, kv, layout] = GetParam();
  testing::PagedProblem pages;
  const testing::Problem f32 = f32_problem(c, pages);
  std::uint64_t seed = 5;
  for (DType q : {DType::f32, DType::bf16, DType::f16}) {
    const testing::Kv8Problem k = testing::quantize_problem(f32, q, kv, layout, ++seed);
    for (const auto& backend : {make_decode_backend(), make_flash_backend()}) {
      const Support fwd = backend->check(k.q8.spec, Pass::forward);
      ASSERT_TRUE(fwd.ok()) << backend->name() << ": " << fwd.to_string();
      // Backward is refused by the per-pass check, naming kv_dtype.
      const Support bwd = backend->check(k.q8.spec, Pass::backward);
      ASSERT_FALSE(bwd.ok());
      EXPECT_NE(bwd.to_string().find("kv_dtype"), std::string::npos) << bwd.to_string();
      const testing::PassResults got = testing::run_backend(*backend, k.q8, false);
      testing::expect_kv8_within_rule(got, k, std::string(backend->name()) + " q=" + std::string(to_string(q)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Kv8Kernels,
    ::testing::Combine(::testing::ValuesIn(cases()), ::testing::Values(DType::fp8_e4m3, DType::fp8_e5m2, DType::i8),
                       ::testing::Values(KVScale::none, KVScale::per_tensor, KVScale::per_head, KVScale::per_token)),
    [](const auto& param_info) { return case_name(param_info.param); });

// The codes' NaN (e4m3, e5m2) and infinity (e5m2) follow the non-finite rules
// of docs/semantics.md as a bf16 cache would: a NaN key makes the rows that
// see it NaN and no other row.
TEST(Kv8NonFinite, NanCodeReachesOnlyTheRowsThatSeeIt) {
  AttentionSpec s = base(4, 40, 64, 64);
  s.batch = 1;
  s.causal = true;
  const testing::Problem f32 = testing::make_problem(s, 3);
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    testing::Kv8Problem k = testing::quantize_problem(f32, DType::f32, kv, KVScale::per_head, 9);
    // Key 38 of kv head 0 (bshd): queries 2 and 3 of heads 0, 1 see it (Sk - Sq = 36).
    k.q8.k.as<std::uint8_t>()[(38 * s.heads_kv + 0) * s.head_dim_qk + 5] = 0x7f;
    for (const auto& backend : {make_decode_backend(), make_flash_backend()}) {
      const testing::PassResults got = testing::run_backend(*backend, k.q8, false);
      for (std::int64_t i = 0; i < 4; ++i) {
        for (std::int64_t h = 0; h < s.heads_q; ++h) {
          const double x = testing::element(got.out, (i * s.heads_q + h) * s.head_dim_v);
          EXPECT_EQ(std::isnan(x), i >= 2 && h < 2)
              << backend->name() << " " << to_string(kv) << " row " << i << " head " << h;
        }
      }
    }
  }
}

// An infinite or NaN code in V makes the rows that see its key non-finite and
// leaves every other row as it would be without it: the kernels then take the
// block's P in f32 through visible_pv, which must apply V's scales once (the
// bf16 GEMM forward scaled P as well: V's scale squared reached those rows).
TEST(Kv8NonFinite, NonFiniteValueCodeLeavesTheOtherRowsExact) {
  const auto reference = make_reference_backend();
  struct Run {
    std::shared_ptr<const Backend> backend;
    std::int64_t sq, key;  // queries; the key whose V gets the bad code
  };
  // Window (20, 0), Sk = 300: the key is seen by kv head 0's query heads 0, 1
  // in the rows whose diagonal is 0-20 keys past it (150-170; decode's 3-7).
  for (const Run& run : {Run{make_flash_backend(), 300, 150}, Run{make_decode_backend(), 8, 295}}) {
    AttentionSpec s = base(run.sq, 300, 64, 64);
    s.batch = 1;
    s.window_left = 20;
    s.window_right = 0;
    const testing::Problem f32 = testing::make_problem(s, 5);
    constexpr std::int64_t kDim = 3;
    for (DType q : {DType::f32, DType::bf16}) {
      for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2}) {
        for (KVScale layout : {KVScale::per_head, KVScale::per_token}) {
          const std::string what = std::string(run.backend->name()) + " " + std::string(to_string(q)) + " " +
                                   std::string(to_string(kv)) + " " + std::string(to_string(layout));
          testing::Kv8Problem k = testing::quantize_problem(f32, q, kv, layout, 11);
          const testing::PassResults want = testing::run_backend(*reference, k.f64, false);
          // e4m3's NaN; e5m2's +inf.
          k.q8.v.as<std::uint8_t>()[(run.key * s.heads_kv + 0) * s.head_dim_v + kDim] =
              kv == DType::fp8_e4m3 ? 0x7f : 0x7c;
          const testing::PassResults got = testing::run_backend(*run.backend, k.q8, false);
          double worst = 0;
          for (std::int64_t i = 0; i < s.seqlen_q; ++i) {
            const std::int64_t diagonal = i + s.seqlen_kv - s.seqlen_q;
            for (std::int64_t h = 0; h < s.heads_q; ++h) {
              const bool sees = h < 2 && run.key <= diagonal && run.key >= diagonal - s.window_left;
              for (std::int64_t d = 0; d < s.head_dim_v; ++d) {
                const std::int64_t at = (i * s.heads_q + h) * s.head_dim_v + d;
                const double x = testing::element(got.out, at);
                if (sees && d == kDim) {
                  EXPECT_FALSE(std::isfinite(x)) << what << " row " << i << " head " << h;
                } else {
                  worst = std::max(worst, std::abs(x - testing::element(want.out, at)));
                }
              }
            }
          }
          EXPECT_LT(worst, q == DType::f32 ? 1e-5 : 2e-2) << what;
        }
      }
    }
  }
}

// A zero or negative softmax scale (finite: allowed) over an 8-bit K: the
// bf16 GEMM forward may not multiply masked scores (-inf) by the scale after
// masking — -inf x 0 is NaN, -inf x -0.125 is +inf.
TEST(Kv8Scale, ZeroAndNegativeSoftmaxScalesMeetTheRule) {
  AttentionSpec s = base(200, 230, 64, 64);
  s.batch = 1;
  s.causal = true;
  for (const double scale : {0.0, -0.125, 1e-39}) {
    s.scale = scale;
    const testing::Problem f32 = testing::make_problem(s, 8);
    for (DType q : {DType::f32, DType::bf16}) {
      const testing::Kv8Problem k = testing::quantize_problem(f32, q, DType::i8, KVScale::per_head, 12);
      for (const auto& backend : {make_decode_backend(), make_flash_backend()}) {
        if (!backend->check(k.q8.spec, Pass::forward).ok()) continue;  // decode: seqlen_q past its limit
        const testing::PassResults got = testing::run_backend(*backend, k.q8, false);
        testing::expect_kv8_within_rule(
            got, k,
            std::string(backend->name()) + " scale " + std::to_string(scale) + " q=" + std::string(to_string(q)));
      }
    }
  }
}

// Logits of 1e9 and more (a huge softmax scale, or an 8-bit K's scales near
// 1e9): the fused softmax of the bf16 forward took the max of the rounded
// scaled scores but subtracted it from an FMA of the same product, leaving
// the product's rounding error (up to 64 at 1e9) in the exponent: NaN or zero
// outputs past ~1e10.
TEST(Kv8Scale, HugeLogitsMeetTheRule) {
  AttentionSpec s = base(40, 230, 64, 64);
  s.batch = 1;
  s.causal = true;
  for (const double scale : {1e8, 1e10, 1e20}) {
    s.scale = scale;
    const testing::Problem f32 = testing::make_problem(s, 8);
    for (DType q : {DType::f32, DType::bf16}) {
      for (KVScale layout : {KVScale::per_head, KVScale::per_token}) {
        const testing::Kv8Problem k8 = testing::quantize_problem(f32, q, DType::i8, layout, 12);
        for (const auto& backend : {make_decode_backend(), make_flash_backend()}) {
          if (!backend->check(k8.q8.spec, Pass::forward).ok()) continue;  // decode: seqlen_q past its limit
          const testing::PassResults got = testing::run_backend(*backend, k8.q8, false);
          testing::expect_kv8_within_rule(got, k8,
                                          std::string(backend->name()) + " scale " + std::to_string(scale) +
                                              " q=" + std::string(to_string(q)) + " " + std::string(to_string(layout)));
        }
      }
    }
  }
}

// Code c, or 0 where c is not finite (int8's -128 is kept out too: symmetric codes).
std::uint8_t finite_code_or_zero(DType kv, int c) {
  const bool finite = kv == DType::i8         ? c != 0x80
                      : kv == DType::fp8_e4m3 ? (c & 0x7f) != 0x7f
                                              : ((c & 0x7f) >> 2) != 31;
  return finite ? static_cast<std::uint8_t>(c) : 0;
}

// A per-tensor scale.
Tensor scale_tensor(float x) {
  Tensor t = Tensor::zeros(DType::f32, {1});
  t.as<float>()[0] = x;
  return t;
}

// Views of q, k, v and the scales (which must outlive the Inputs).
Inputs coded_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& ks, const Tensor& vs) {
  Inputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  in.k_scale = ks;
  in.v_scale = vs;
  return in;
}

// Every finite code through each family's widening loads: with one key, P = 1
// and the output row is V's row exactly (f32 queries), so out[d] must be the
// code's value times its scale, bit for bit, at every position of a vector.
TEST(Kv8Codes, EveryFiniteCodeWidensExactly) {
  AttentionSpec s = base(1, 1, 16, 256);
  s.batch = 1;
  s.heads_q = s.heads_kv = 1;
  s.kv_scale = KVScale::per_tensor;
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2, DType::i8}) {
    s.kv_dtype = kv;
    Tensor q = Tensor::zeros(DType::f32, {1, 1, 1, 16}), k = Tensor::zeros(kv, {1, 1, 1, 16}),
           v = Tensor::zeros(kv, {1, 1, 1, 256});
    for (int c = 0; c < 256; ++c) v.as<std::uint8_t>()[c] = finite_code_or_zero(kv, c);
    const Tensor ks = scale_tensor(1.0f), vs = scale_tensor(0.75f);
    const Inputs in = coded_inputs(q, k, v, ks, vs);
    for (const auto& backend : {make_decode_backend(), make_flash_backend()}) {
      Tensor out = Tensor::zeros(DType::f32, {1, 1, 1, 256}), lse = Tensor::zeros(DType::f32, {1, 1, 1});
      backend->forward(ForwardArgs{s, in, out, lse});
      for (int c = 0; c < 256; ++c) {
        const float want = static_cast<float>(testing::code_value(v.view(), c)) * 0.75f;
        EXPECT_EQ(out.as<float>()[c], want) << backend->name() << " " << to_string(kv) << " code " << c;
      }
    }
  }
}

// The same for bf16 queries, whose kernels read K and V as bf16 (decode's and
// flash's vdpbf16ps paths: every code is a bf16, widened through f32, or for
// e4m3 looked up in a table): V as above (out[d] = code * 0.75 rounded to
// bf16), and K through the LSE — row (b, h) has q one-hot at dim
// d = 16 b + h, so with one key its LSE is scale * code(d), exactly (to 1e-6
// on flash). Each code sits at its own position of a 32-code load.
TEST(Kv8Codes, EveryFiniteCodeWidensExactlyForBf16Queries) {
  AttentionSpec s = base(1, 1, 256, 256);
  s.batch = 16;
  s.heads_q = 16;
  s.heads_kv = 1;
  s.dtype = DType::bf16;
  s.kv_scale = KVScale::per_tensor;
  Tensor q = Tensor::zeros(DType::bf16, {16, 1, 16, 256});
  for (std::int64_t r = 0; r < 256; ++r) q.as<std::uint16_t>()[r * 256 + r] = 0x3f80;  // 1.0 at dim b * 16 + h
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2, DType::i8}) {
    s.kv_dtype = kv;
    Tensor k = Tensor::zeros(kv, {16, 1, 1, 256}), v = Tensor::zeros(kv, {16, 1, 1, 256});
    for (int i = 0; i < 16 * 256; ++i)
      k.as<std::uint8_t>()[i] = v.as<std::uint8_t>()[i] = finite_code_or_zero(kv, i % 256);
    const Tensor ks = scale_tensor(1.0f), vs = scale_tensor(0.75f);
    const Inputs in = coded_inputs(q, k, v, ks, vs);
    for (const auto& backend : {make_decode_backend(), make_flash_backend()}) {
      Tensor out = Tensor::zeros(DType::bf16, {16, 1, 16, 256}), lse = Tensor::zeros(DType::f32, {16, 16, 1});
      backend->forward(ForwardArgs{s, in, out, lse});
      for (std::int64_t r = 0; r < 256; ++r) {
        const float lse_want = static_cast<float>(testing::code_value(k.view(), r)) * 0.0625f;
        // Within 1e-6 (flash's exp2 polynomial leaves l = 1 + 1 ulp: LSE = s + 1.2e-7), far below
        // a code's step (the smallest here: e4m3's 2^-9 * 0.0625 = 1.2e-4).
        EXPECT_NEAR(lse.as<float>()[r], lse_want, 1e-6) << backend->name() << " " << to_string(kv) << " K code " << r;
        for (int c = 0; c < 256; ++c) {
          const float want = static_cast<float>(testing::code_value(v.view(), c)) * 0.75f;
          // Within one bf16 step of the exact product (flash's 1 / l = 1 - 1 ulp can tip a tie
          // of the output's rounding), below a code's step (int8's 127 vs 126: 0.8 %).
          const float got = std::bit_cast<float>(std::uint32_t{out.as<std::uint16_t>()[r * 256 + c]} << 16);
          ASSERT_NEAR(got, want, std::fabs(want) * 0x1p-8f)
              << backend->name() << " " << to_string(kv) << " V code " << c << " row " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attend
