// Autotuned selection: the measured winner, the persistent cache file (reuse,
// invalidation, corruption) and training-mode candidates — proven with test
// backends whose speed is known. Every test points the cache at its own
// temporary file, never the user's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "attend/tune.h"
#include "runtime/fake_backends.h"
#include "runtime/tune_cache.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::ForwardOnlyMismatchBackend;

// Computes through the reference and then waits `delay`: its speed is known.
class TimedBackend final : public Backend {
 public:
  TimedBackend(std::string name, std::chrono::microseconds delay) : name_(std::move(name)), delay_(delay) {}
  std::string_view name() const override { return name_; }
  std::shared_ptr<testing::CallCounts> counts = std::make_shared<testing::CallCounts>();

 protected:
  void supports(const AttentionSpec& s, Pass, const Target&, Support& sup) const override {
    sup.require(s.dtype == DType::f32 || s.dtype == DType::f64, ReasonCode::dtype, "f32 and f64 only");
  }
  std::size_t scratch_bytes(const AttentionSpec& s, Pass pass, const Target&) const override {
    return reference_->workspace_bytes(s, pass);
  }
  void run_forward(const ForwardArgs& a) const override {
    counts->forwards++;
    reference_->forward(a);
    std::this_thread::sleep_for(delay_);
  }
  void run_backward(const BackwardArgs& a) const override {
    counts->backwards++;
    reference_->backward(a);
    std::this_thread::sleep_for(delay_);
  }

 private:
  std::string name_;
  std::chrono::microseconds delay_;
  std::shared_ptr<const Backend> reference_ = make_reference_backend();
};

AttentionSpec tiny() {
  AttentionSpec s;
  s.batch = 1;
  s.seqlen_q = 8;
  s.seqlen_kv = 12;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.head_dim_qk = s.head_dim_v = 16;
  s.causal = true;
  return s;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class AutotuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Registry::global().reset_to_builtins();
    slow = std::make_shared<TimedBackend>("slow_fake", std::chrono::microseconds(3000));
    fast = std::make_shared<TimedBackend>("fast_fake", std::chrono::microseconds(0));
    register_backend(slow, 1000);  // priority prefers the slow one
    register_backend(fast, 900);
    dir = std::filesystem::temp_directory_path() / ("attend_autotune_" + std::to_string(::getpid()) + "_" +
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    cache = (dir / "autotune.json").string();
    policy.disabled = {"flash", "decode", "reference"};
    policy.strategy = Strategy::autotune;
    policy.tune_cache = cache;
    set_policy(Policy{});
    forget_tuning();
  }
  void TearDown() override {
    Registry::global().reset_to_builtins();
    set_policy(Policy{});
    forget_tuning();
    unsetenv("ATTEND_NUM_THREADS");
    std::filesystem::remove_all(dir);
  }
  int timed_runs() const { return slow->counts->forwards + fast->counts->forwards; }

  std::shared_ptr<TimedBackend> slow, fast;
  std::filesystem::path dir;
  std::string cache;
  Policy policy;
};

const Verdict& verdict(const Selection& sel, std::string_view name) {
  for (const Verdict& v : sel.verdicts) {
    if (v.backend == name) return v;
  }
  throw std::runtime_error("no verdict for " + std::string(name));
}

TEST_F(AutotuneTest, TheFasterBackendWinsUnderAutotuneAndLosesUnderPriority) {
  Policy prio = policy;
  prio.strategy = Strategy::priority;
  const Selection by_priority = select(tiny(), Mode::inference, prio);
  EXPECT_EQ(by_priority.backend->name(), "slow_fake");
  EXPECT_EQ(timed_runs(), 0) << "priority measures nothing";
  EXPECT_FALSE(verdict(by_priority, "fast_fake").seconds);

  const Selection tuned = select(tiny(), Mode::inference, policy);
  EXPECT_EQ(tuned.backend->name(), "fast_fake") << tuned.explain();
  ASSERT_TRUE(verdict(tuned, "fast_fake").seconds && verdict(tuned, "slow_fake").seconds);
  EXPECT_LT(*verdict(tuned, "fast_fake").seconds, *verdict(tuned, "slow_fake").seconds);
  EXPECT_GE(*verdict(tuned, "slow_fake").seconds, 3e-3);
  EXPECT_FALSE(verdict(tuned, "reference").seconds) << "disabled plans are never timed";
  const std::string text = tuned.explain();
  EXPECT_NE(text.find("strategy: autotune (measured now"), std::string::npos) << text;
  EXPECT_NE(text.find("chosen (fastest)"), std::string::npos) << text;
  EXPECT_NE(text.find("x slower)"), std::string::npos) << text;
  EXPECT_NE(tuned.to_json().find("\"strategy\": \"autotune\""), std::string::npos);
  EXPECT_NE(tuned.to_json().find("\"seconds\": "), std::string::npos);
}

TEST_F(AutotuneTest, TuningNeverWritesTheCallersOutputsAndResultsEqualTheWinnerRunDirectly) {
  const testing::Problem p = testing::make_problem(tiny(), 7);
  Tensor out = Tensor::zeros(DType::f32, {1, 8, 2, 16});
  Tensor lse = Tensor::zeros(DType::f32, {1, 2, 8});
  for (std::int64_t i = 0; i < out.numel(); ++i) out.as<float>()[i] = 12345.0f;
  PlanOptions opt;
  opt.policy = &policy;
  const Plan plan = Plan::make(tiny(), Mode::inference, opt);  // tunes here
  ASSERT_EQ(plan.backend().name(), "fast_fake");
  EXPECT_GT(slow->counts->forwards, 0) << "the loser was timed";
  for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.as<float>()[i], 12345.0f) << "tuning wrote into out";
  plan.forward(p.inputs, out, lse);
  const testing::PassResults direct = testing::run_backend(*fast, p, false);
  EXPECT_TRUE(testing::bitwise_equal(out, direct.out));
  EXPECT_TRUE(testing::bitwise_equal(lse, direct.lse));
  const testing::PassResults ref = testing::run_backend(*make_reference_backend(), p, false);
  EXPECT_LT(testing::max_abs_diff(out, ref.out), 1e-6);
}

TEST_F(AutotuneTest, TrainingTimesOnlyPlansWithBothPasses) {
  auto fwd_only = std::make_shared<ForwardOnlyMismatchBackend>();
  register_backend(fwd_only, 2000);
  AttentionSpec mla = tiny();
  mla.head_dim_v = 32;  // fa3_like's backward needs equal head dims
  const Selection train = select(mla, Mode::training, policy);
  EXPECT_EQ(train.backend->name(), "fast_fake") << train.explain();
  EXPECT_EQ(fwd_only->counts->forwards, 0) << "a forward-only plan was timed for training";
  EXPECT_FALSE(verdict(train, "fa3_like").seconds);
  EXPECT_GT(fast->counts->backwards, 0) << "training times forward + backward";
  EXPECT_GE(*verdict(train, "slow_fake").seconds, 6e-3) << "forward and backward each wait 3 ms";
  // Inference of the same shape is another bucket, where it competes.
  const Selection inf = select(mla, Mode::inference, policy);
  EXPECT_GT(fwd_only->counts->forwards, 0);
  EXPECT_TRUE(verdict(inf, "fa3_like").seconds);
}

TEST_F(AutotuneTest, OneTuningPerBucketAndTheFileServesTheNextProcess) {
  (void)select(tiny(), Mode::inference, policy);
  const int after_first = timed_runs();
  AttentionSpec mate = tiny();
  mate.seqlen_kv = 15;  // same power-of-two bucket (<= 16)
  mate.seqlen_q = 7;
  EXPECT_EQ(select(mate, Mode::inference, policy).backend->name(), "fast_fake");
  EXPECT_EQ(timed_runs(), after_first) << "a bucket-mate re-tuned";
  ASSERT_EQ(tune_bucket(mate, Mode::inference), tune_bucket(tiny(), Mode::inference));

  const nlohmann::json j = nlohmann::json::parse(read_text(cache));
  EXPECT_EQ(j["format"], "attend-autotune");
  const std::string machine = detail::current_machine().text();
  ASSERT_TRUE(j["machines"].contains(machine)) << j.dump(1);
  const auto& rec = j["machines"][machine]["buckets"][tune_bucket(tiny(), Mode::inference)];
  EXPECT_EQ(rec["winner"], "fast_fake:default");
  EXPECT_TRUE(rec["seconds"].contains("slow_fake:default"));

  // A fresh start (as another process would) reads the file instead of timing.
  forget_tuning();
  const Selection again = select(tiny(), Mode::inference, policy);
  EXPECT_EQ(again.backend->name(), "fast_fake");
  EXPECT_EQ(timed_runs(), after_first);
  EXPECT_NE(again.tuning.find("times recorded"), std::string::npos) << again.tuning;
}

TEST_F(AutotuneTest, AnotherThreadCountOrVersionIsNotReused) {
  setenv("ATTEND_NUM_THREADS", "1", 1);
  (void)select(tiny(), Mode::inference, policy);
  const int one = timed_runs();
  setenv("ATTEND_NUM_THREADS", "2", 1);
  forget_tuning();
  const Selection two = select(tiny(), Mode::inference, policy);
  EXPECT_GT(timed_runs(), one) << "times of another thread count were reused";
  EXPECT_NE(two.tuning.find("measured now"), std::string::npos);

  // The same file rewritten as if by another attend version: nothing applies.
  std::string text = read_text(cache);
  const std::string version = ";attend=" + detail::current_machine().version;
  for (auto at = text.find(version); at != std::string::npos; at = text.find(version, at + 1)) {
    text.replace(at, version.size(), ";attend=0.0.0-older");
  }
  std::ofstream(cache, std::ios::trunc) << text;
  forget_tuning();
  const int before = timed_runs();
  const Selection other = select(tiny(), Mode::inference, policy);
  EXPECT_GT(timed_runs(), before) << "times of another attend version were reused";
  // Both sections are kept: one file serves several builds or thread counts.
  const nlohmann::json j = nlohmann::json::parse(read_text(cache));
  EXPECT_EQ(j["machines"].size(), 3u) << j.dump(1);
}

TEST_F(AutotuneTest, ACorruptOrForeignFileIsIgnoredWithAWarningAndRewritten) {
  for (const char* bad : {"{\"format\": \"attend-autotune\", \"machines\": [1,", "[1, 2, 3]",
                          "{\"format\": \"something-else\", \"format_version\": 1, \"machines\": {}}",
                          "{\"format\": \"attend-autotune\", \"format_version\": 1, \"machines\": {\"x\": 5}}", ""}) {
    std::ofstream(cache, std::ios::trunc) << bad;
    forget_tuning();
    ::testing::internal::CaptureStderr();
    const Selection sel = select(tiny(), Mode::inference, policy);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(sel.backend->name(), "fast_fake") << bad;
    if (std::string(bad).find("\"x\": 5") == std::string::npos && *bad) {
      EXPECT_NE(err.find("warning: autotune cache"), std::string::npos) << bad;
    }
    const nlohmann::json j = nlohmann::json::parse(read_text(cache), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not rewritten as JSON after: " << bad;
    EXPECT_EQ(j["machines"][detail::current_machine().text()]["buckets"].size(), 1u) << j.dump(1);
  }
}

TEST_F(AutotuneTest, AnUnwritableCacheKeepsResultsInMemory) {
  policy.tune_cache = (dir / "file_not_dir").string() + "/sub/autotune.json";
  std::ofstream((dir / "file_not_dir").string()) << "x";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(select(tiny(), Mode::inference, policy).backend->name(), "fast_fake");
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("kept in memory only"), std::string::npos);
}

TEST_F(AutotuneTest, AHeldLockCostsABoundedWaitThenResultsStayInMemoryWithAWarning) {
  // Another open file description holding the flock: what a writer stopped
  // mid-save (Ctrl-Z) looks like to this process.
  const int holder = ::open((cache + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(holder, 0);
  ASSERT_EQ(::flock(holder, LOCK_EX), 0);
  using Clock = std::chrono::steady_clock;
  ::testing::internal::CaptureStderr();
  auto start = Clock::now();
  EXPECT_EQ(select(tiny(), Mode::inference, policy).backend->name(), "fast_fake");
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_GE(waited, 3.0) << "gave up before the 3 s a live writer may need";
  EXPECT_LT(waited, 30.0);
  EXPECT_NE(err.find(cache + ".lock is held by another process; gave up after 3000 ms"), std::string::npos) << err;
  EXPECT_NE(err.find("kept in memory only"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(cache));
  // Remembered in memory; a lock still held costs no second wait.
  const int runs = timed_runs();
  EXPECT_EQ(select(tiny(), Mode::inference, policy).backend->name(), "fast_fake");
  EXPECT_EQ(timed_runs(), runs);
  AttentionSpec other = tiny();
  other.seqlen_kv = 100;
  start = Clock::now();
  (void)select(other, Mode::inference, policy);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 2.0);
  // Once the lock is free again the next store writes the file.
  ::close(holder);
  other.seqlen_kv = 400;
  (void)select(other, Mode::inference, policy);
  const nlohmann::json j = nlohmann::json::parse(read_text(cache));
  EXPECT_EQ(j["machines"][detail::current_machine().text()]["buckets"].size(), 1u) << j.dump(1);
}

TEST_F(AutotuneTest, TuneRemeasuresAndTheLogLineAppearsOncePerBucket) {
  policy.log = LogLevel::info;
  ::testing::internal::CaptureStderr();
  (void)select(tiny(), Mode::inference, policy);
  (void)select(tiny(), Mode::inference, policy);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const auto first = err.find("[attend] autotune inference");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("[attend] autotune inference", first + 1), std::string::npos) << err;
  const int before = timed_runs();
  const Selection again = tune(tiny(), Mode::inference, policy);
  EXPECT_GT(timed_runs(), before);
  EXPECT_EQ(again.backend->name(), "fast_fake");
}

// The scratch data must satisfy every backend's tensor validation for each
// problem kind, or the plans could not be timed at all.
TEST_F(AutotuneTest, EveryProblemKindIsTimedOnValidScratchDataByEveryViablePlan) {
  policy.disabled.clear();  // the real backends too
  AttentionSpec varlen = tiny();
  varlen.layout = Layout::thd;
  varlen.batch = 3;
  varlen.total_q = 20;
  varlen.total_kv = 30;
  AttentionSpec paged = tiny();
  paged.batch = 2;
  paged.kv_page_size = 4;
  paged.kv_leftpad = true;
  AttentionSpec features = tiny();
  features.layout = Layout::bhsd;
  features.has_bias = true;
  features.bias_requires_grad = true;
  features.alibi = true;
  features.dropout_p = 0.1;
  AttentionSpec half = tiny();
  half.dtype = DType::bf16;
  const std::pair<AttentionSpec, Mode> cases[] = {{varlen, Mode::training},
                                                  {paged, Mode::inference},
                                                  {features, Mode::training},
                                                  {half, Mode::training},
                                                  {half, Mode::inference}};
  for (const auto& [spec, mode] : cases) {
    const Selection sel = tune(spec, mode, policy);
    ASSERT_TRUE(sel.backend) << describe(spec);
    int timed = 0;
    for (const Verdict& v : sel.verdicts) {
      EXPECT_EQ(v.seconds.has_value(), v.viable) << v.backend << ":" << v.variant << " " << describe(spec);
      timed += v.seconds ? 1 : 0;
    }
    EXPECT_GE(timed, 1) << sel.explain();
  }
}

TEST_F(AutotuneTest, TheStrategyComesFromTheEnvironment) {
  setenv("ATTEND_SELECT", "autotune", 1);
  setenv("ATTEND_TUNE_CACHE", cache.c_str(), 1);
  const Policy env = Policy::from_env();
  setenv("ATTEND_SELECT", "fastest", 1);
  try {
    (void)Policy::from_env();
    ADD_FAILURE() << "ATTEND_SELECT=fastest accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "ATTEND_SELECT");
    EXPECT_EQ(e.value(), "fastest");
  }
  unsetenv("ATTEND_SELECT");
  unsetenv("ATTEND_TUNE_CACHE");
  EXPECT_EQ(env.strategy, Strategy::autotune);
  EXPECT_EQ(env.tune_cache, cache);
  Policy off = policy;
  off.tune_cache = "off";
  EXPECT_EQ(tune_cache_file(off), "");
  EXPECT_EQ(select(tiny(), Mode::inference, off).backend->name(), "fast_fake");
  EXPECT_FALSE(std::filesystem::exists(cache)) << "tune_cache=off wrote a file";
}

}  // namespace
}  // namespace attend
