// flash (f32) against the f64 reference on odd shapes and every feature, forward
// and all gradients, with FlashAttention's same-precision-baseline rule
// (docs/semantics.md §7): err(flash) <= C * err(naive f32) + atol, where the
// naive f32 computation is the reference backend accumulating in f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "support/baseline.h"
#include "support/feature_case.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::PassResults;

using FlashCase = testing::FeatureCase;
using testing::expect_within_baseline;

class FlashVsReference : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashVsReference, ForwardAndGradientsWithinSamePrecisionBaseline) {
  const FlashCase& c = GetParam();
  const AttentionSpec s = c.spec(1234);
  const testing::Problem p32 = testing::make_problem(s, 42, c.lens_q, c.lens_kv);
  const testing::Problem p64 = testing::problem_as_f64(p32);

  const PassResults flash = testing::run_backend(*make_flash_backend(), p32, true);
  const PassResults naive = testing::run_backend(*make_reference_backend({.accumulate_f64 = false}), p32, true);
  const PassResults ref = testing::run_backend(*make_reference_backend(), p64, true);

  expect_within_baseline("out", flash.out, naive.out, ref.out, 2, testing::max_abs(ref.out));
  expect_within_baseline("lse", flash.lse, naive.lse, ref.lse, 2, testing::max_abs(ref.lse));
  const double grads = std::max({testing::max_abs(ref.dq), testing::max_abs(ref.dk), testing::max_abs(ref.dv)});
  expect_within_baseline("dq", flash.dq, naive.dq, ref.dq, 3, grads);
  expect_within_baseline("dk", flash.dk, naive.dk, ref.dk, 3, grads);
  expect_within_baseline("dv", flash.dv, naive.dv, ref.dv, 3, grads);
  if (ref.dsinks.defined()) {
    expect_within_baseline("dsinks", flash.dsinks, naive.dsinks, ref.dsinks, 3, testing::max_abs(ref.dsinks));
  }
}

FlashCase make(std::string name, std::int64_t sq, std::int64_t sk, std::int64_t dqk, std::int64_t dv) {
  return testing::make_case(std::move(name), sq, sk, dqk, dv);
}

std::vector<FlashCase> cases() {
  std::vector<FlashCase> v;
  // Partial tiles in both dimensions and degenerate lengths.
  v.push_back(make("plain_113x203_d64", 113, 203, 64, 64));
  v.push_back(make("plain_1x239_d128", 1, 239, 128, 128));
  v.push_back(make("plain_239x1_d128", 239, 1, 128, 128));
  v.push_back(make("plain_512x256_d64", 512, 256, 64, 64));
  // Head-dim pairs: MLA, 64/512, v smaller, odd sizes.
  v.push_back(make("mla_192x128", 113, 203, 192, 128));
  v.push_back(make("d64_v512", 97, 130, 64, 512));
  v.push_back(make("d128_v64", 130, 97, 128, 64));
  v.push_back(make("odd_59_111", 113, 203, 59, 111));
  v.push_back(make("odd_111_59", 70, 33, 111, 59));
  v.push_back(make("max_256_256", 65, 70, 256, 256));
  // Masks (bottom-right causal with Sq<Sk and Sq>Sk; windows).
  auto c = make("causal_113x203", 113, 203, 64, 64);
  c.causal = true;
  v.push_back(c);
  c = make("causal_239x100_empty_rows", 239, 100, 64, 64);
  c.causal = true;
  v.push_back(c);
  c = make("causal_1023x1024", 1023, 1024, 64, 64);
  c.causal = true;
  c.heads = c.heads_kv = 1;
  v.push_back(c);
  c = make("window_17_5", 150, 170, 64, 64);
  c.wl = 17;
  c.wr = 5;
  v.push_back(c);
  c = make("causal_window_40", 200, 180, 64, 32);
  c.causal = true;
  c.wl = 40;
  v.push_back(c);
  // Logit terms.
  c = make("softcap_15", 113, 203, 64, 64);
  c.softcap = 15;
  v.push_back(c);
  // A huge cap makes softcap the identity in exact arithmetic; its tanh runs
  // near 0, where the naive 1 - 2/(exp(2x)+1) loses all precision.
  c = make("softcap_huge_1e6", 70, 90, 64, 64);
  c.softcap = 1e6;
  v.push_back(c);
  c = make("softcap_2_causal", 90, 120, 72, 40);
  c.softcap = 2;
  c.causal = true;
  v.push_back(c);
  c = make("alibi", 113, 203, 64, 64);
  c.alibi = true;
  v.push_back(c);
  c = make("bias_no_grad", 113, 203, 64, 64);
  c.bias = true;
  v.push_back(c);
  c = make("dropout_0.17", 113, 203, 64, 64);
  c.dropout = 0.17;
  v.push_back(c);
  // GQA / MQA.
  c = make("gqa_4_2", 113, 203, 64, 64);
  c.heads = 4;
  c.heads_kv = 2;
  v.push_back(c);
  c = make("mqa_4_1_causal", 77, 150, 64, 64);
  c.heads = 4;
  c.heads_kv = 1;
  c.causal = true;
  v.push_back(c);
  // 8 (batch, kv head) pairs: backward tasks own whole GQA groups (fewer pairs
  // split a group into slices whose dK/dV shares are summed, as gqa_4_2 above).
  c = make("varlen_gqa_8_pairs_unsplit", 0, 0, 64, 48);
  c.lens_q = {40, 17, 0, 65};
  c.lens_kv = {50, 17, 30, 80};
  c.heads = 8;
  c.heads_kv = 2;
  c.causal = true;
  v.push_back(c);
  // Varlen with an empty query sequence and an empty key sequence.
  c = make("varlen_empty", 0, 0, 64, 48);
  c.lens_q = {70, 0, 5, 33};
  c.lens_kv = {90, 20, 0, 120};
  v.push_back(c);
  c = make("varlen_causal_gqa_dropout", 0, 0, 64, 64);
  c.lens_q = {70, 3, 129};
  c.lens_kv = {90, 64, 100};
  c.causal = true;
  c.heads = 4;
  c.heads_kv = 2;
  c.dropout = 0.1;
  v.push_back(c);
  // Layouts.
  c = make("layout_bhsd", 65, 130, 64, 64);
  c.layout = Layout::bhsd;
  v.push_back(c);
  c = make("layout_sbhd_causal", 65, 130, 64, 64);
  c.layout = Layout::sbhd;
  c.causal = true;
  v.push_back(c);
  // Rows that see exactly one key: exact dq and dk are 0, and the textbook
  // D = sum_j P dP cancels dP exactly there; flash's D = rowsum(dO * O) must
  // too (noise growing with head_dim_v otherwise).
  v.push_back(make("one_key_512x1_d64_v512", 512, 1, 64, 512));
  v.push_back(testing::make_case("one_key_300x1_d96_v256_gqa", 300, 1, 96, 256, 4, 2));
  c = make("window_0_0_200_d96_v256", 200, 200, 96, 256);
  c.wl = c.wr = 0;
  v.push_back(c);
  // ... with large logits: dV = P^T dO is exact only when the backward's
  // P = exp(s - LSE) is exactly 1, i.e. it forms the forward's scores.
  c.name = "window_0_0_large_logits_d96_v256";
  c.scale = 8 / std::sqrt(96.0);
  v.push_back(c);
  // dV and dK summed over many query rows and the heads of a group.
  v.push_back(testing::make_case("many_rows_2048x64_d64_v512_mqa", 2048, 64, 64, 512, 4, 1));
  // Softcap 30 with logits near and far past the cap (FlashAttention's q * softcap, as the scale).
  for (const auto& [name, dim, q_mul, heads_kv] :
       {std::tuple{"softcap_30_near_cap_gqa", 128, 30.0, 2}, std::tuple{"softcap_30_far_past_cap_mqa", 64, 60.0, 1}}) {
    c = testing::make_case(name, 113, 203, dim, dim, 4, heads_kv);
    c.softcap = 30;
    c.scale = q_mul / std::sqrt(static_cast<double>(dim));
    v.push_back(c);
  }
  // Absorbed MLA: qk 576 (512 latent + 64 rope), v 512, one shared latent KV head.
  c = testing::make_case("mla_absorbed_576_512_mqa_causal", 70, 90, 576, 512, 4, 1);
  c.causal = true;
  v.push_back(c);
  c = testing::make_case("mla_absorbed_576_512_gqa_sinks", 33, 40, 576, 512, 4, 2);
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  // Attention sinks (softmax_type), with their gradient, across the features.
  c = make("sinks_learnable_causal_empty_rows", 150, 100, 64, 64);
  c.causal = true;
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  c = make("sinks_off_by_one_window", 120, 130, 64, 64);
  c.wl = 17;
  c.wr = 5;
  c.softmax = SoftmaxType::off_by_one;
  v.push_back(c);
  c = testing::make_case("sinks_learnable_gqa_softcap_mla_192_128", 77, 150, 192, 128, 4, 2);
  c.softcap = 15;
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  c = make("sinks_learnable_varlen_dropout", 0, 0, 64, 48);
  c.lens_q = {70, 0, 5, 33};
  c.lens_kv = {90, 20, 0, 120};
  c.dropout = 0.1;
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  // Everything at once.
  c = make("combined", 100, 157, 96, 80);
  c.causal = true;
  c.wl = 64;
  c.softcap = 10;
  c.alibi = true;
  c.bias = true;
  c.dropout = 0.2;
  c.heads = 4;
  c.heads_kv = 2;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& param_info) {
                           std::string n = param_info.param.name;
                           for (char& ch : n) if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace attend
