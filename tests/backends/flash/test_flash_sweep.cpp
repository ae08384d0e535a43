// flash (f32) against the f64 reference on a seeded random sweep of
// FlashAttention's own test grid (fa_semantics.md §4: test_flash_attn_output's
// seqlen pairs and head dims, MHA/MQA/GQA, causal, local windows drawn as
// randint(0, Sk), softcap 50 with q * 50), every gradient under the
// same-precision-baseline rule. Sizes are capped so that one run of the suite
// (once per kernel family) stays within a few seconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "support/baseline.h"
#include "support/feature_case.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::PassResults;

constexpr int kCases = 14;
// Work cap per case: Sq * Sk * H * (D + Dv) multiply-adds per GEMM pass.
constexpr double kMaxWork = 24e6;

struct SweepCase {
  testing::FeatureCase c;
  double q_mul = 1;
};

SweepCase draw(std::mt19937_64& rng) {
  static constexpr std::int64_t kPairs[][2] = {{1, 147},   {113, 203}, {128, 217},   {113, 211},   {108, 256},
                                               {256, 512}, {512, 256}, {1023, 1024}, {1024, 1023}, {1024, 1024}};
  static constexpr std::int64_t kDims[] = {32, 40, 59, 64, 96, 111, 128, 160, 192, 224, 256};
  const auto pick = [&](std::int64_t n) { return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n)); };
  for (;;) {
    const auto& pair = kPairs[pick(std::size(kPairs))];
    const std::int64_t d = kDims[pick(std::size(kDims))];
    const std::int64_t kind = pick(3), h = kind == 2 ? 4 : 2, hk = kind == 1 ? 1 : 2;  // MHA, MQA, GQA
    SweepCase s{testing::make_case("", pair[0], pair[1], d, d, h, hk)};
    if (static_cast<double>(pair[0] * pair[1] * h * 2 * d) > kMaxWork) continue;
    switch (pick(4)) {
      case 1: s.c.causal = true; break;
      case 2:
        s.c.wl = pick(pair[1]);
        s.c.wr = pick(pair[1]);
        break;
      case 3:
        s.c.softcap = 50;
        s.q_mul = 50;
        break;
      default: break;
    }
    s.c.name = std::to_string(pair[0]) + "x" + std::to_string(pair[1]) + " d" + std::to_string(d) + " h" +
               std::to_string(h) + "/" + std::to_string(hk) + (s.c.causal ? " causal" : "") +
               (s.c.wl >= 0 ? " window(" + std::to_string(s.c.wl) + "," + std::to_string(s.c.wr) + ")" : "") +
               (s.c.softcap > 0 ? " softcap50 q*50" : "");
    return s;
  }
}

TEST(FlashSweep, FlashAttentionGridGradientsWithinSamePrecisionBaseline) {
  std::mt19937_64 rng(20261203);
  for (int t = 0; t < kCases; ++t) {
    const SweepCase s = draw(rng);
    SCOPED_TRACE(s.c.name);
    testing::Problem p32 = testing::make_problem(s.c.spec(t), 100 + t);
    for (std::int64_t i = 0; i < p32.q.numel(); ++i) p32.q.as<float>()[i] *= static_cast<float>(s.q_mul);
    const testing::Problem p64 = testing::problem_as_f64(p32);
    const PassResults flash = testing::run_backend(*make_flash_backend(), p32, true);
    const PassResults naive = testing::run_backend(*make_reference_backend({.accumulate_f64 = false}), p32, true);
    const PassResults ref = testing::run_backend(*make_reference_backend(), p64, true);
    testing::expect_within_baseline("out", flash.out, naive.out, ref.out, 2, testing::max_abs(ref.out));
    testing::expect_within_baseline("lse", flash.lse, naive.lse, ref.lse, 2, testing::max_abs(ref.lse));
    const double grads = std::max({testing::max_abs(ref.dq), testing::max_abs(ref.dk), testing::max_abs(ref.dv)});
    testing::expect_within_baseline("dq", flash.dq, naive.dq, ref.dq, 3, grads);
    testing::expect_within_baseline("dk", flash.dk, naive.dk, ref.dk, 3, grads);
    testing::expect_within_baseline("dv", flash.dv, naive.dv, ref.dv, 3, grads);
  }
}

}  // namespace
}  // namespace attend
