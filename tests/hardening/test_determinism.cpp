// Determinism: every registered backend's backward (forward too) is bitwise
// identical over 1000 reruns, and `deterministic` specs give identical bits
// for every thread count 1..N.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <thread>

#include "attend/attend.h"
#include "support/tensors.h"

namespace attend {
namespace {

AttentionSpec small_spec() {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = 9;
  s.seqlen_kv = 13;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 16;
  s.head_dim_v = 8;
  s.causal = true;
  s.dropout_p = 0.1;
  s.dropout_seed = 3;
  s.deterministic = true;
  return s;
}

void expect_same(const testing::PassResults& a, const testing::PassResults& b, bool backward) {
  ASSERT_TRUE(testing::bitwise_equal(a.out, b.out));
  ASSERT_TRUE(testing::bitwise_equal(a.lse, b.lse));
  if (!backward) return;
  ASSERT_TRUE(testing::bitwise_equal(a.dq, b.dq));
  ASSERT_TRUE(testing::bitwise_equal(a.dk, b.dk));
  ASSERT_TRUE(testing::bitwise_equal(a.dv, b.dv));
}

TEST(Determinism, EveryBackendIsBitwiseIdenticalOver1000Reruns) {
  const testing::Problem p = testing::make_problem(small_spec(), 7);
  int backends = 0;
  for (const auto& e : Registry::global().backends()) {
    const Backend& b = *e.backend;
    if (!b.check(p.spec, Pass::forward).ok()) continue;
    const bool bwd = b.check(p.spec, Pass::backward).ok();
    SCOPED_TRACE(std::string(b.name()));
    const testing::PassResults first = testing::run_backend(b, p, bwd);
    for (int run = 1; run < 1000; ++run) {
      expect_same(first, testing::run_backend(b, p, bwd), bwd);
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "rerun " << run;
        return;
      }
    }
    ++backends;
  }
  EXPECT_GE(backends, 2);  // flash and reference at least
}

TEST(Determinism, DeterministicSpecIsIdenticalForEveryThreadCount) {
  const testing::Problem p = testing::make_problem(small_spec(), 8);
  const int saved = omp_get_max_threads();
  const int max_threads = std::max(4, static_cast<int>(std::thread::hardware_concurrency()));
  for (const auto& e : Registry::global().backends()) {
    const Backend& b = *e.backend;
    if (!b.check(p.spec, Pass::forward).ok()) continue;
    const bool bwd = b.check(p.spec, Pass::backward).ok();
    SCOPED_TRACE(std::string(b.name()));
    omp_set_num_threads(1);
    const testing::PassResults one = testing::run_backend(b, p, bwd);
    for (int n = 2; n <= max_threads; ++n) {
      omp_set_num_threads(n);
      SCOPED_TRACE("threads=" + std::to_string(n));
      expect_same(one, testing::run_backend(b, p, bwd), bwd);
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace attend
