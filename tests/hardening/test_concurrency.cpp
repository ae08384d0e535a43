// Many threads selecting and running different problems at once, through the
// shared selection cache, while the policy and the registry change under them.
// Every result must equal (bitwise) what the chosen backend computes alone:
// under TSan (scripts/test-hardening.sh) this is also the race check.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "support/tensors.h"

namespace attend {
namespace {

struct Case {
  testing::Problem p;
  Mode mode = Mode::training;
  // Expected results per backend name, computed single-threaded up front.
  std::vector<std::pair<std::string, testing::PassResults>> expected;
};

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  for (int i = 0; i < 6; ++i) {
    AttentionSpec s;
    s.batch = 1 + i % 2;
    s.seqlen_q = 5 + 3 * i;
    s.seqlen_kv = i == 3 ? 1 : 7 + 2 * i;
    s.heads_q = 2;
    s.heads_kv = i % 2 ? 1 : 2;
    s.head_dim_qk = 8 + 8 * (i % 3);
    s.head_dim_v = 8;
    s.causal = i % 2 == 0;
    s.dropout_p = i == 4 ? 0.2 : 0.0;
    s.dropout_seed = 42;
    Case c;
    c.p = testing::make_problem(s, 100 + static_cast<std::uint64_t>(i));
    c.mode = i == 5 ? Mode::inference : Mode::training;
    for (const auto& e : Registry::global().backends()) {
      const bool fwd = e.backend->check(s, Pass::forward).ok();
      const bool bwd = c.mode == Mode::inference || e.backend->check(s, Pass::backward).ok();
      if (fwd && bwd) {
        c.expected.emplace_back(std::string(e.backend->name()),
                                testing::run_backend(*e.backend, c.p, c.mode == Mode::training));
      }
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(Concurrency, ThreadsSelectingAndRunningUnderPolicyAndRegistryChurnGetExactResults) {
  const std::vector<Case> cases = make_cases();
  constexpr int kWorkers = 8, kIterations = 12;
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, runs{0};

  // Churn: alternate policies (auto, reference forced, flash disabled) and
  // re-register a reference copy, bumping the registry generation.
  std::thread churn([&] {
    int k = 0;
    while (!stop.load()) {
      Policy p;
      if (k % 3 == 1) p.force = "reference";
      if (k % 3 == 2) p.disabled = {"flash"};
      set_policy(p);
      if (k % 5 == 0) register_backend(make_reference_backend(), 0);
      ++k;
      std::this_thread::yield();
    }
  });

  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      for (int it = 0; it < kIterations; ++it) {
        const Case& c = cases[static_cast<std::size_t>(w + it) % cases.size()];
        try {
          ForwardResult f = forward(c.p.inputs, c.p.spec, c.mode);
          Gradients g;
          if (c.mode == Mode::training) g = backward(f.ctx, c.p.dout);
          const std::string name(f.ctx.backend().name());
          bool matched = false;
          for (const auto& [backend, want] : c.expected) {
            if (backend != name) continue;
            matched = testing::bitwise_equal(f.out, want.out) && testing::bitwise_equal(f.lse, want.lse) &&
                      (c.mode == Mode::inference ||
                       (testing::bitwise_equal(g.dq, want.dq) && testing::bitwise_equal(g.dk, want.dk) &&
                        testing::bitwise_equal(g.dv, want.dv)));
          }
          if (!matched) failures.fetch_add(1);
          runs.fetch_add(1);
        } catch (const Error& e) {
          // A forced backend that cannot run the case is the only acceptable error.
          if (e.code() != ErrorCode::unsupported) failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  stop.store(true);
  churn.join();
  set_policy(Policy{});
  Registry::global().reset_to_builtins();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(runs.load(), kWorkers * kIterations / 2);
}

TEST(Concurrency, ConcurrentSelectOfOneSpecReturnsOneBackend) {
  AttentionSpec s;
  s.seqlen_q = s.seqlen_kv = 32;
  clear_selection_cache();
  std::vector<std::string> names(16);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < names.size(); ++i) {
    threads.emplace_back([&, i] { names[i] = std::string(select(s, Mode::training, Policy{}).backend->name()); });
  }
  for (auto& t : threads) t.join();
  for (const auto& n : names) EXPECT_EQ(n, names[0]);
}

}  // namespace
}  // namespace attend
