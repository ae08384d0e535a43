// Selector behaviour: pass-aware capability checks, fallback, policy, cache,
// explanations — proven with test backends whose support differs by pass.
#include <gtest/gtest.h>

#include <cstdlib>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "runtime/fake_backends.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::ForwardOnlyMismatchBackend;
using testing::make_problem;
using testing::max_abs_diff;

AttentionSpec mla_spec(std::int64_t dqk, std::int64_t dv) {
  AttentionSpec s;
  s.batch = 1;
  s.seqlen_q = 6;
  s.seqlen_kv = 9;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  s.causal = true;
  s.dtype = DType::f64;
  return s;
}

class SelectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A controlled registry: the reference backend plus the test backend.
    Registry::global().reset_to_builtins();
    Registry::global().unregister_backend("flash");
    Registry::global().unregister_backend("decode");
    Registry::global().unregister_backend("cuda");  // built with CUDA: serves no host tensors anyway
    Registry::global().unregister_backend("cudnn");  // likewise, where cuDNN was found
    set_policy(Policy{});
    fake = std::make_shared<ForwardOnlyMismatchBackend>();
    register_backend(fake, 50);
  }
  void TearDown() override {
    Registry::global().reset_to_builtins();
    set_policy(Policy{});
  }
  std::shared_ptr<ForwardOnlyMismatchBackend> fake;
};

class MismatchedHeadDims : public SelectTest, public ::testing::WithParamInterface<std::pair<int, int>> {};

TEST_P(MismatchedHeadDims, TrainingRejectsForwardOnlyBackendAndFallsBack) {
  const auto [dqk, dv] = GetParam();
  const Selection sel = select(mla_spec(dqk, dv), Mode::training);
  EXPECT_EQ(sel.backend->name(), "reference");
  ASSERT_EQ(sel.verdicts.size(), 2u);
  const Verdict& v = sel.verdicts[0];
  EXPECT_EQ(v.backend, "fa3_like");
  EXPECT_TRUE(v.forward.ok());
  ASSERT_TRUE(v.backward.has_value());
  ASSERT_FALSE(v.backward->ok());
  EXPECT_FALSE(v.viable);
  // The explanation names the backend, the failing pass and the reason.
  const std::string table = sel.explain();
  EXPECT_NE(table.find("fa3_like"), std::string::npos);
  EXPECT_NE(table.find("backward: "), std::string::npos);
  EXPECT_NE(table.find(v.backward->reasons[0].message), std::string::npos);
  EXPECT_NE(table.find("selected: reference"), std::string::npos);
}

TEST_P(MismatchedHeadDims, TrainingStepCompletesThroughFallbackAndMatchesReference) {
  const auto [dqk, dv] = GetParam();
  auto p = make_problem(mla_spec(dqk, dv), 7);
  auto fwd = forward(p.inputs, p.spec, Mode::training);
  EXPECT_EQ(fwd.ctx.backend().name(), "reference");
  const Gradients g = backward(fwd.ctx, p.dout);
  EXPECT_EQ(fake->counts->forwards.load(), 0);
  EXPECT_EQ(fake->counts->backwards.load(), 0);

  // Same numbers as calling the reference backend directly.
  auto ref = make_reference_backend();
  Tensor out = Tensor::zeros_like(fwd.out), lse = Tensor::zeros_like(fwd.lse);
  ref->forward(ForwardArgs{p.spec, p.inputs, out, lse});
  Tensor dq = Tensor::zeros_like(p.q), dk = Tensor::zeros_like(p.k), dv_ = Tensor::zeros_like(p.v);
  ref->backward(BackwardArgs{p.spec, p.inputs, out, lse, p.dout, dq, dk, dv_, {}});
  EXPECT_EQ(max_abs_diff(fwd.out, out), 0.0);
  EXPECT_EQ(max_abs_diff(g.dq, dq), 0.0);
  EXPECT_EQ(max_abs_diff(g.dk, dk), 0.0);
  EXPECT_EQ(max_abs_diff(g.dv, dv_), 0.0);
}

TEST_P(MismatchedHeadDims, InferenceKeepsForwardOnlyBackend) {
  const auto [dqk, dv] = GetParam();
  const Selection sel = select(mla_spec(dqk, dv), Mode::inference);
  EXPECT_EQ(sel.backend->name(), "fa3_like");
  EXPECT_FALSE(sel.verdicts[0].backward.has_value());  // inference never asks for backward
  auto p = make_problem(mla_spec(dqk, dv), 11);
  auto fwd = forward(p.inputs, p.spec, Mode::inference);
  EXPECT_EQ(fake->counts->forwards.load(), 1);
  EXPECT_EQ(fwd.ctx.backend().name(), "fa3_like");
}

TEST_P(MismatchedHeadDims, ForcingTheUnfitBackendFailsEarlyWithItsReasons) {
  const auto [dqk, dv] = GetParam();
  Policy forced;
  forced.force = "fa3_like";
  auto p = make_problem(mla_spec(dqk, dv), 3);
  try {
    (void)forward(p.inputs, p.spec, Mode::training, &forced);
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_EQ(e.field(), "Policy::force");  // an API policy names its own field, not an unset variable
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fake->counts->forwards.load(), 0);  // failed before any kernel ran
}

INSTANTIATE_TEST_SUITE_P(Mla, MismatchedHeadDims, ::testing::Values(std::pair{192, 128}, std::pair{64, 512}),
                         [](const auto& param_info) {
                           return "qk" + std::to_string(param_info.param.first) + "_v" +
                                  std::to_string(param_info.param.second);
                         });

// The seed scenario for attention sinks: a backend that takes sinks in forward
// but has no sink-logit gradient is rejected for training, with that reason,
// and kept for inference.
TEST_F(SelectTest, LearnableSinksTrainingRejectsBackendWithoutSinkGradient) {
  AttentionSpec s = mla_spec(64, 64);
  s.softmax_type = SoftmaxType::learnable;
  const Selection train = select(s, Mode::training);
  EXPECT_EQ(train.backend->name(), "reference");
  const Verdict& v = train.verdicts[0];
  ASSERT_EQ(v.backend, "fa3_like");
  EXPECT_TRUE(v.forward.ok());
  ASSERT_TRUE(v.backward.has_value());
  EXPECT_TRUE(v.backward->failed(ReasonCode::sinks));
  EXPECT_NE(train.explain().find("softmax_type=learnable: no gradient for the sink logits"), std::string::npos)
      << train.explain();
  EXPECT_EQ(select(s, Mode::inference).backend->name(), "fa3_like");
  // off_by_one has no gradient to return: the same backend trains it.
  s.softmax_type = SoftmaxType::off_by_one;
  EXPECT_EQ(select(s, Mode::training).backend->name(), "fa3_like");
}

TEST_F(SelectTest, LearnableSinksTrainingStepReturnsDsinksThroughTheFallback) {
  AttentionSpec s = mla_spec(64, 64);
  s.softmax_type = SoftmaxType::learnable;
  auto p = make_problem(s, 7);
  auto fwd = forward(p.inputs, p.spec, Mode::training);
  EXPECT_EQ(fwd.ctx.backend().name(), "reference");
  const Gradients g = backward(fwd.ctx, p.dout);
  ASSERT_TRUE(g.dsinks.defined());
  EXPECT_EQ(g.dsinks.view().shape[0], s.heads_q);
  EXPECT_GT(testing::max_abs(g.dsinks), 1e-6);
  EXPECT_EQ(fake->counts->backwards.load(), 0);
}

TEST_F(SelectTest, SquareHeadDimsTrainingPrefersHigherPriorityBackend) {
  EXPECT_EQ(select(mla_spec(64, 64), Mode::training).backend->name(), "fa3_like");
}

TEST_F(SelectTest, KernelRefusesUnsupportedPassWhenCalledDirectly) {
  auto p = make_problem(mla_spec(192, 128), 5);
  Tensor out = testing::token_tensor(p.spec, 6, 0, 2, 128, DType::f64);
  Tensor lse = Tensor::zeros(DType::f64, {1, 2, 6});
  fake->forward(ForwardArgs{p.spec, p.inputs, out, lse});
  Tensor dq = Tensor::zeros_like(p.q), dk = Tensor::zeros_like(p.k), dv = Tensor::zeros_like(p.v);
  EXPECT_THROW(fake->backward(BackwardArgs{p.spec, p.inputs, out, lse, p.dout, dq, dk, dv, {}}), Error);
  EXPECT_EQ(fake->counts->backwards.load(), 0);
}

TEST_F(SelectTest, BackwardRunsOnForwardsBackendEvenAfterPolicyChange) {
  auto p = make_problem(mla_spec(32, 32), 9);
  auto fwd = forward(p.inputs, p.spec, Mode::training);
  ASSERT_EQ(fwd.ctx.backend().name(), "fa3_like");
  Policy disable;
  disable.disabled = {"fa3_like"};
  set_policy(disable);
  (void)backward(fwd.ctx, p.dout);
  EXPECT_EQ(fake->counts->backwards.load(), 1);
}

TEST_F(SelectTest, DisabledBackendIsSkippedWithVerdict) {
  Policy pol;
  pol.disabled = {"fa3_like"};
  const Selection sel = select(mla_spec(192, 128), Mode::inference, pol);
  EXPECT_EQ(sel.backend->name(), "reference");
  EXPECT_TRUE(sel.verdicts[0].disabled);
  EXPECT_NE(sel.explain().find("disabled by policy"), std::string::npos);
}

TEST_F(SelectTest, ForcedBackendWinsOverPriority) {
  Policy pol;
  pol.force = "reference";
  const Selection sel = select(mla_spec(192, 128), Mode::inference, pol);
  EXPECT_EQ(sel.backend->name(), "reference");
  EXPECT_TRUE(sel.verdicts[0].not_forced);
}

TEST_F(SelectTest, UnknownBackendNamesInPolicyAreErrors) {
  Policy force;
  force.force = "nosuch";
  EXPECT_THROW((void)select(mla_spec(64, 64), Mode::inference, force), Error);
  Policy disable;
  disable.disabled = {"nosuch"};
  EXPECT_THROW((void)select(mla_spec(64, 64), Mode::inference, disable), Error);
}

TEST_F(SelectTest, NothingFitsErrorContainsWholeTable) {
  // Each backend declines for its own reason: fa3_like the head dim, the
  // reference its score memory (65536^2 f64 scores exceed its 8 GiB default).
  AttentionSpec s = mla_spec(300, 300);
  s.seqlen_q = s.seqlen_kv = 65536;
  try {
    (void)select(s, Mode::training);
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("fa3_like"), std::string::npos) << what;
    EXPECT_NE(what.find("reference"), std::string::npos) << what;
    EXPECT_NE(what.find("head_dim_qk=300"), std::string::npos) << what;
    EXPECT_NE(what.find("[head_dim_qk]"), std::string::npos) << what;
    EXPECT_NE(what.find("[memory]"), std::string::npos) << what;
  }
}

TEST_F(SelectTest, SelectionsAreCachedPerSpecAndMode) {
  const AttentionSpec s = mla_spec(64, 64);
  (void)select(s, Mode::training);
  const int after_first = fake->counts->checks.load();
  EXPECT_EQ(after_first, 2);  // forward + backward
  (void)select(s, Mode::training);
  EXPECT_EQ(fake->counts->checks.load(), after_first);  // cache hit: no new checks
  (void)select(s, Mode::inference);                     // another mode is another entry
  EXPECT_EQ(fake->counts->checks.load(), after_first + 1);
  AttentionSpec other = s;
  other.seqlen_kv *= 4;  // another power-of-two bucket: another entry
  (void)select(other, Mode::training);
  EXPECT_EQ(fake->counts->checks.load(), after_first + 3);
}

// A decode loop grows seqlen_kv by one per step: within a power-of-two bucket
// the cached choice is re-checked on the exact spec (forward + backward of the
// chosen candidate, no text) instead of re-running the whole selection.
TEST_F(SelectTest, GrowingKeyCountReusesTheBucketsSelectionAfterARecheck) {
  AttentionSpec s = mla_spec(64, 64);
  s.seqlen_kv = 65;
  const Plan first = Plan::make(s, Mode::training);
  EXPECT_EQ(first.backend().name(), "fa3_like");
  const int after_first = fake->counts->checks.load();
  for (std::int64_t sk = 66; sk <= 128; ++sk) {
    s.seqlen_kv = sk;
    const Plan p = Plan::make(s, Mode::training);
    EXPECT_EQ(p.backend().name(), "fa3_like");
    EXPECT_EQ(p.spec().seqlen_kv, sk);
    EXPECT_EQ(&p.selection(), &first.selection());  // the cached selection, not a new one
  }
  EXPECT_EQ(fake->counts->checks.load(), after_first + 2 * 63);
  // The explanation is of the plan's own spec, not the bucket's first one.
  EXPECT_NE(Plan::make(s, Mode::training).explain().find("Sk=128"), std::string::npos);
}

TEST_F(SelectTest, PolicyAndRegistryChangesInvalidateCache) {
  const AttentionSpec s = mla_spec(64, 64);
  EXPECT_EQ(select(s, Mode::training).backend->name(), "fa3_like");
  Policy pol;
  pol.disabled = {"fa3_like"};
  set_policy(pol);
  EXPECT_EQ(select(s, Mode::training).backend->name(), "reference");
  set_policy(Policy{});
  EXPECT_EQ(select(s, Mode::training).backend->name(), "fa3_like");
  // A new, higher-priority backend is seen at once.
  auto better = std::make_shared<ForwardOnlyMismatchBackend>("better");
  register_backend(better, 90);
  EXPECT_EQ(select(s, Mode::training).backend->name(), "better");
  ASSERT_TRUE(Registry::global().unregister_backend("better"));
  EXPECT_EQ(select(s, Mode::training).backend->name(), "fa3_like");
  const int before = fake->counts->checks.load();
  clear_selection_cache();
  (void)select(s, Mode::training);
  EXPECT_GT(fake->counts->checks.load(), before);
}

TEST_F(SelectTest, JsonListsEveryBackendWithReasons) {
  const std::string json = select(mla_spec(192, 128), Mode::training).to_json();
  EXPECT_NE(json.find("\"selected\": \"reference\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\": \"fa3_like\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"code\": \"head_dim_mismatch\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"mode\": \"training\""), std::string::npos) << json;
}

TEST_F(SelectTest, ExplanationShowsTheNotesOfSupportedPassesOnly) {
  // (192, 128): fa3_like supports forward only, so only its forward note is shown...
  const Selection mla = select(mla_spec(192, 128), Mode::training);
  const std::string text = mla.explain();
  EXPECT_NE(text.find("note forward: forward computed through the reference (a test backend)\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("note backward:"), std::string::npos) << text;
  // ...while the JSON keeps every pass's notes as data.
  const std::string json = mla.to_json();
  EXPECT_NE(json.find("\"notes\": [\"backward computed through the reference (a test backend)\"]"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"notes\": []"), std::string::npos) << json;  // the reference's f64 passes

  // (128, 128): both passes supported, both notes shown.
  const std::string square = select(mla_spec(128, 128), Mode::training).explain();
  EXPECT_NE(square.find("note forward: forward computed"), std::string::npos) << square;
  EXPECT_NE(square.find("note backward: backward computed"), std::string::npos) << square;
}

TEST_F(SelectTest, InfoLogPrintsEachDistinctSelectionOnce) {
  Policy pol;
  pol.log = LogLevel::info;
  ::testing::internal::CaptureStderr();
  (void)select(mla_spec(192, 128), Mode::training, pol);
  (void)select(mla_spec(192, 128), Mode::training, pol);
  const std::string err = ::testing::internal::GetCapturedStderr();
  std::size_t count = 0;
  for (std::size_t pos = err.find("new selection"); pos != std::string::npos; pos = err.find("new selection", pos + 1))
    ++count;
  EXPECT_EQ(count, 1u) << err;
  EXPECT_NE(err.find("selected: reference"), std::string::npos);
}

TEST_F(SelectTest, PolicyReadsEnvironment) {
  ::setenv("ATTEND_BACKEND", "reference", 1);
  ::setenv("ATTEND_DISABLE", "fa3_like, other", 1);
  ::setenv("ATTEND_LOG", "debug", 1);
  const Policy p = Policy::from_env();
  ::setenv("ATTEND_LOG", "loud", 1);
  EXPECT_THROW((void)Policy::from_env(), Error);
  ::unsetenv("ATTEND_BACKEND");
  ::unsetenv("ATTEND_DISABLE");
  ::unsetenv("ATTEND_LOG");
  ASSERT_TRUE(p.force.has_value());
  EXPECT_EQ(*p.force, "reference");
  EXPECT_EQ(p.disabled, (std::vector<std::string>{"fa3_like", "other"}));
  EXPECT_EQ(p.log, LogLevel::debug);
}

TEST_F(SelectTest, RegistryRejectsNullBackend) { EXPECT_THROW(register_backend(nullptr, 1), Error); }

}  // namespace
}  // namespace attend
