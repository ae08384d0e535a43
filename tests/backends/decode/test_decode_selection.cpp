// Training/inference selection proven on the real backends (decode, flash,
// reference), and a randomized selector-kernel agreement test: whatever select()
// returns runs and matches the reference; whatever a check declines raises
// attend::Error when called directly, never crashes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/decode.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "backends/decode/paged_problem.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::PassResults;

class RealBackends : public ::testing::TestWithParam<std::pair<int, int>> {
 protected:
  void SetUp() override {
    Registry::global().reset_to_builtins();
    set_policy(Policy{});
  }
  void TearDown() override { set_policy(Policy{}); }

  AttentionSpec shape(bool decode_shaped) const {
    AttentionSpec s;
    s.batch = 2;
    s.heads_q = 8;
    s.heads_kv = 2;
    s.head_dim_qk = GetParam().first;
    s.head_dim_v = GetParam().second;
    s.seqlen_q = decode_shaped ? 1 : 96;
    s.seqlen_kv = decode_shaped ? 1500 : 96;
    s.causal = true;
    return s;
  }
};

const Verdict& verdict(const Selection& sel, const std::string& name) {
  for (const Verdict& v : sel.verdicts) {
    if (v.backend == name) return v;
  }
  throw std::runtime_error("no verdict for " + name);
}

bool has_code(const Support& s, ReasonCode code) {
  for (const Reason& r : s.reasons) {
    if (r.code == code) return true;
  }
  return false;
}

// Forward (and backward) through the public API against the f64 reference.
void expect_matches_reference(const testing::Problem& p, const ForwardResult& fwd, const Gradients* g) {
  const PassResults naive =
      testing::run_backend(*make_reference_backend({.accumulate_f64 = false}), p, g != nullptr);
  const PassResults ref = testing::run_backend(*make_reference_backend(), testing::problem_as_f64(p), g != nullptr);
  testing::expect_within_baseline("out", fwd.out, naive.out, ref.out, 2);
  testing::expect_within_baseline("lse", fwd.lse, naive.lse, ref.lse, 2);
  if (g == nullptr) return;
  const double m = std::max({testing::max_abs(ref.dq), testing::max_abs(ref.dk), testing::max_abs(ref.dv)});
  testing::expect_within_baseline("dq", g->dq, naive.dq, ref.dq, 3, m);
  testing::expect_within_baseline("dk", g->dk, naive.dk, ref.dk, 3, m);
  testing::expect_within_baseline("dv", g->dv, naive.dv, ref.dv, 3, m);
}

TEST_P(RealBackends, InferenceOnDecodeShapeSelectsDecodeAndMatchesReference) {
  const testing::Problem p = testing::make_problem(shape(true), 21);
  EXPECT_EQ(select(p.spec, Mode::inference).backend->name(), "decode");
  const ForwardResult fwd = forward(p.inputs, p.spec, Mode::inference);
  EXPECT_EQ(fwd.ctx.backend().name(), "decode");
  expect_matches_reference(p, fwd, nullptr);
}

TEST_P(RealBackends, TrainingRejectsDecodeForNoBackwardAndTrainsOnABackendWithOne) {
  for (const bool decode_shaped : {true, false}) {
    const testing::Problem p = testing::make_problem(shape(decode_shaped), 22);
    const Selection sel = select(p.spec, Mode::training);
    const Verdict& d = verdict(sel, "decode");
    ASSERT_TRUE(d.backward.has_value());
    EXPECT_TRUE(has_code(*d.backward, ReasonCode::no_backward)) << sel.explain();
    EXPECT_NE(sel.explain().find("no backward"), std::string::npos);
    EXPECT_FALSE(d.viable);
    EXPECT_EQ(sel.backend->name(), "flash");
    ForwardResult fwd = forward(p.inputs, p.spec, Mode::training);
    EXPECT_EQ(fwd.ctx.backend().name(), "flash");
    const Gradients g = backward(fwd.ctx, p.dout);
    expect_matches_reference(p, fwd, &g);
  }
}

TEST_P(RealBackends, InferenceOnPrefillShapeDefersFromDecodeToFlashWithoutAReason) {
  const testing::Problem p = testing::make_problem(shape(false), 23);
  const Selection sel = select(p.spec, Mode::inference);
  const Verdict& d = verdict(sel, "decode");
  // The crossover is a speed preference: decode can run it, priority prefers flash.
  EXPECT_TRUE(d.forward.ok()) << sel.explain();
  EXPECT_TRUE(d.viable);
  EXPECT_NE(d.deferred.find("seqlen_q=" + std::to_string(p.spec.seqlen_q)), std::string::npos) << d.deferred;
  EXPECT_EQ(sel.backend->name(), "flash");
  const std::string text = sel.explain();
  EXPECT_NE(text.find("~ defers: seqlen_q="), std::string::npos) << text;
  EXPECT_EQ(text.find("[seqlen]"), std::string::npos) << text;
  expect_matches_reference(p, forward(p.inputs, p.spec, Mode::inference), nullptr);
  // Forced, decode runs that shape, and matches the reference too.
  Policy forced;
  forced.force = "decode";
  const ForwardResult fwd = forward(p.inputs, p.spec, Mode::inference, &forced);
  EXPECT_EQ(fwd.ctx.backend().name(), "decode");
  expect_matches_reference(p, fwd, nullptr);
}

TEST_P(RealBackends, DisablingDecodeFallsBackToTheNextViableBackendWithTheSameResults) {
  const testing::Problem p = testing::make_problem(shape(true), 24);
  const ForwardResult with_decode = forward(p.inputs, p.spec, Mode::inference);
  ASSERT_EQ(with_decode.ctx.backend().name(), "decode");
  // The API policy and the environment variable are the same switch.
  Policy api;
  api.disabled = {"decode"};
  setenv("ATTEND_DISABLE", "decode", 1);
  const Policy env = Policy::from_env();
  unsetenv("ATTEND_DISABLE");
  for (const Policy& pol : {api, env}) {
    const ForwardResult fwd = forward(p.inputs, p.spec, Mode::inference, &pol);
    EXPECT_EQ(fwd.ctx.backend().name(), "flash");
    EXPECT_TRUE(verdict(fwd.ctx.selection(), "decode").disabled);
    expect_matches_reference(p, fwd, nullptr);
    EXPECT_LT(testing::max_abs_diff(fwd.out, with_decode.out), 1e-5);
    EXPECT_LT(testing::max_abs_diff(fwd.lse, with_decode.lse), 1e-5);
  }
}

TEST_P(RealBackends, ForcingDecodeForTrainingFailsEarlyWithTheReason) {
  const testing::Problem p = testing::make_problem(shape(true), 25);
  setenv("ATTEND_BACKEND", "decode", 1);
  const Policy forced = Policy::from_env();
  unsetenv("ATTEND_BACKEND");
  ASSERT_EQ(forced.force, "decode");
  // select() alone raises it: nothing has been allocated or run yet.
  try {
    (void)select(p.spec, Mode::training, forced);
    FAIL() << "select accepted decode for training";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_EQ(e.field(), "ATTEND_BACKEND");
    EXPECT_NE(std::string(e.what()).find("no backward"), std::string::npos) << e.what();
  }
  try {
    (void)forward(p.inputs, p.spec, Mode::training, &forced);
    FAIL() << "forward accepted decode for training";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "ATTEND_BACKEND");
    EXPECT_NE(std::string(e.what()).find("no backward"), std::string::npos) << e.what();
  }
  // The same force is fine for inference.
  EXPECT_EQ(select(p.spec, Mode::inference, forced).backend->name(), "decode");
}

INSTANTIATE_TEST_SUITE_P(HeadDims, RealBackends, ::testing::Values(std::pair{192, 128}, std::pair{64, 512}),
                         [](const auto& param_info) {
                           return "qk" + std::to_string(param_info.param.first) + "_v" + std::to_string(param_info.param.second);
                         });

// --- randomized selector-kernel agreement -------------------------------------

struct RandomCase {
  testing::Problem p;                // f32/f64 problem (bf16: shapes only, zero data)
  std::optional<testing::PagedProblem> paged;
  Mode mode = Mode::inference;
};

RandomCase random_case(std::mt19937_64& rng) {
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  AttentionSpec s;
  const std::int64_t hk = pick(1, 2);
  s.heads_kv = hk;
  s.heads_q = hk * pick(1, 3);
  const std::int64_t dims[][2] = {{16, 16}, {8, 24}, {33, 17}, {64, 64}, {192, 128}, {64, 512}, {300, 64}, {32, 600}};
  const auto& d = dims[pick(0, 7)];
  s.head_dim_qk = d[0];
  s.head_dim_v = d[1];
  s.seqlen_q = coin(0.6) ? pick(1, 4) : pick(0, 24);
  const bool training = coin(0.5);
  // Long caches (several decode splits) for inference; training stays small,
  // since three backward passes per case dominate the run time.
  s.seqlen_kv = (training || coin(0.4)) ? pick(0, 40) : pick(200, 700);
  s.batch = pick(1, 3);
  s.causal = coin(0.4);
  if (coin(0.3)) s.window_left = pick(0, 50);
  if (coin(0.2)) s.window_right = pick(0, 10);
  if (coin(0.2)) s.softcap = 4.0;
  s.alibi = coin(0.2);
  s.has_bias = coin(0.2);
  s.bias_requires_grad = s.has_bias && coin(0.3);
  if (coin(0.15)) s.dropout_p = 0.2;
  s.dropout_seed = static_cast<std::uint64_t>(pick(0, 1000));
  s.deterministic = coin(0.2);
  const double dt = std::uniform_real_distribution<double>(0, 1)(rng);
  s.dtype = dt < 0.8 ? DType::f32 : (dt < 0.9 ? DType::f64 : DType::bf16);
  const int layout = static_cast<int>(pick(0, 3));
  s.layout = layout == 0 ? Layout::bshd : layout == 1 ? Layout::bhsd : layout == 2 ? Layout::sbhd : Layout::thd;
  RandomCase c;
  c.mode = training ? Mode::training : Mode::inference;
  const std::uint64_t seed = rng();
  const DType want = s.dtype;
  if (want == DType::bf16) s.dtype = DType::f32;  // generate in f32, then swap in bf16 buffers
  if (s.layout != Layout::thd && want != DType::bf16 && coin(0.25)) {
    std::vector<std::int32_t> lens, pads;
    for (std::int64_t b = 0; b < s.batch; ++b) {
      lens.push_back(static_cast<std::int32_t>(pick(0, s.seqlen_kv + 5)));
      pads.push_back(static_cast<std::int32_t>(coin(0.3) ? pick(0, lens.back()) : 0));
    }
    s.has_bias = s.bias_requires_grad = false;  // keys per sequence differ; keep bias out
    c.paged = testing::make_paged(s, std::int64_t{1} << pick(0, 6), lens, pads, seed);
    c.p = testing::paged_as_problem(*c.paged);
    if (want == DType::f64) c.p = testing::paged_as_f64(*c.paged);
    return c;
  }
  std::vector<std::int32_t> lq, lk;
  if (s.layout == Layout::thd) {
    for (std::int64_t b = 0; b < s.batch; ++b) {
      lq.push_back(static_cast<std::int32_t>(pick(0, std::max<std::int64_t>(s.seqlen_q, 1))));
      lk.push_back(static_cast<std::int32_t>(pick(0, std::max<std::int64_t>(s.seqlen_kv, 1))));
    }
    s.has_bias = s.bias_requires_grad = false;  // bias shape uses the maxima; keep it simple
  }
  c.p = testing::make_problem(s, seed, lq, lk);
  if (want == DType::f64) c.p = testing::problem_as_f64(c.p);
  if (want == DType::bf16) {
    c.p.spec.dtype = DType::bf16;
    for (Tensor* t : {&c.p.q, &c.p.k, &c.p.v, &c.p.dout}) {
      TensorView v = t->view();
      v.dtype = DType::bf16;
      *t = Tensor::zeros_like(v);
    }
    if (c.p.bias.defined()) {
      TensorView v = c.p.bias.view();
      v.dtype = DType::bf16;
      c.p.bias = Tensor::zeros_like(v);
      c.p.inputs.bias = c.p.bias;
    }
    c.p.inputs.q = c.p.q;
    c.p.inputs.k = c.p.k;
    c.p.inputs.v = c.p.v;
  }
  return c;
}

TEST(SelectorKernelAgreement, SelectedBackendsRunAndMatchAndDeclinedOnesRaise) {
  Registry::global().reset_to_builtins();
  set_policy(Policy{});
  std::mt19937_64 rng(20240611);
  int selected = 0, declined_calls = 0, by_decode = 0;
  for (int n = 0; n < 150; ++n) {
    const RandomCase c = random_case(rng);
    const testing::Problem& p = c.p;
    SCOPED_TRACE("case " + std::to_string(n) + ": " + describe(p.spec) + " [" + std::string(to_string(c.mode)) + "]");
    const bool training = c.mode == Mode::training;
    std::optional<Selection> sel;
    try {
      sel = select(p.spec, c.mode);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
    }
    if (sel) {
      ++selected;
      by_decode += sel->backend->name() == "decode";
      const bool grads = training;
      PassResults got;
      ASSERT_NO_THROW(got = testing::run_backend(*sel->backend, p, grads)) << sel->explain();
      if (p.spec.dtype == DType::f32) {
        const PassResults naive = testing::run_backend(*make_reference_backend({.accumulate_f64 = false}), p, grads);
        const testing::Problem p64 = c.paged ? testing::paged_as_f64(*c.paged) : testing::problem_as_f64(p);
        const PassResults ref = testing::run_backend(*make_reference_backend(), p64, grads);
        testing::expect_within_baseline("out", got.out, naive.out, ref.out, 2);
        testing::expect_within_baseline("lse", got.lse, naive.lse, ref.lse, 2);
        if (grads) {
          const double m = std::max({testing::max_abs(ref.dq), testing::max_abs(ref.dk), testing::max_abs(ref.dv)});
          testing::expect_within_baseline("dq", got.dq, naive.dq, ref.dq, 3, m);
          testing::expect_within_baseline("dk", got.dk, naive.dk, ref.dk, 3, m);
          testing::expect_within_baseline("dv", got.dv, naive.dv, ref.dv, 3, m);
        }
      }
    }
    // Every backend that declines a pass must refuse it when called directly.
    for (const RegisteredBackend& rb : Registry::global().backends()) {
      const Backend& be = *rb.backend;
      if (!be.check(p.spec, Pass::forward).ok()) {
        ++declined_calls;
        EXPECT_THROW((void)testing::run_backend(be, p, false), Error) << be.name();
      } else if (!be.check(p.spec, Pass::backward).ok() && p.spec.dtype != DType::bf16) {
        ++declined_calls;
        EXPECT_THROW((void)testing::run_backend(be, p, true), Error) << be.name() << " backward";
      }
    }
  }
  // The generator must actually exercise both outcomes.
  EXPECT_GT(selected, 60);
  EXPECT_GT(by_decode, 15);
  EXPECT_GT(declined_calls, 60);
}

// Decode sizes its scratch inside check(), before any memory validation, so a
// varlen batch whose longest query is near INT64_MAX must be declined with the
// memory reason rather than overflow (found by fuzz_cli_flags, bug 9).
TEST(DecodeCheck, HugeSeqlenQIsDeclinedForMemoryWithoutOverflow) {
  const auto decode = make_decode_backend();
  AttentionSpec s;
  s.batch = 1;
  s.heads_q = 8;
  s.heads_kv = 1;
  s.head_dim_qk = s.head_dim_v = 64;
  s.seqlen_kv = 6;
  for (const std::int64_t sq : {std::int64_t{1} << 40, std::int64_t{44444444444444444}, INT64_MAX}) {
    s.seqlen_q = sq;
    const Support sup = decode->check(s, Pass::forward);
    EXPECT_FALSE(sup.ok()) << sq;
    EXPECT_TRUE(has_code(sup, ReasonCode::memory)) << sq;
  }
}

}  // namespace
}  // namespace attend
