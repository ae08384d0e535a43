// The conformance suite: every feature case x every registered host-memory
// backend x every variant it can run here x every pass, compared with the float64 reference
// under the same-precision-baseline rule (docs/semantics.md). A pass the check
// declines is counted, not run; the counts are printed, and a backend that
// declines every case fails the suite, so a backend that silently does
// nothing is visible. Backends come from the registry: a new backend folder
// in the build's list is tested here without editing this file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "support/baseline.h"
#include "support/conformance_cases.h"
#include "support/feature_case.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::FeatureCase;
using testing::PassResults;

struct Tally {
  int ran = 0, declined = 0;
};

TEST(Conformance, EveryBackendAndVariantMatchesTheReferenceWhereItsCheckAccepts) {
  const auto entries = Registry::global().backends();
  const auto naive = make_reference_backend({.accumulate_f64 = false});
  const auto oracle = make_reference_backend();
  std::map<std::string, Tally> tally;
  for (const FeatureCase& fc : testing::conformance_cases()) {
    for (bool offsets : {false, true}) {
      if (offsets && !fc.lens_q.empty()) continue;
      AttentionSpec spec = fc.spec(77);
      if (offsets) spec = testing::with_offsets(spec);
      const testing::Problem p32 = testing::make_problem(spec, 5, fc.lens_q, fc.lens_kv);
      const testing::Problem p64 = testing::problem_as_f64(p32);
      const PassResults ref = testing::run_backend(*oracle, p64, true);
      const PassResults base = testing::run_backend(*naive, p32, true);
      const double grads = std::max({testing::max_abs(ref.dq), testing::max_abs(ref.dk), testing::max_abs(ref.dv)});
      for (const RegisteredBackend& e : entries) {
        const Backend& backend = *e.backend;
        // Device backends run the same cases in their own suite (tests/backends/cuda).
        if (!backend.serves(DeviceKind::cpu)) continue;
        const auto variants = backend.variants();
        for (std::size_t vi = 0; vi < variants.size(); ++vi) {
          if (!variants[vi].unavailable.empty()) continue;  // this CPU cannot run it
          const std::string label = std::string(backend.name()) + ":" + variants[vi].name;
          const Target target{Device::cpu(), static_cast<int>(vi)};
          const std::string where = label + " on " + fc.name + (offsets ? " +offsets" : "");
          if (!backend.check(p32.spec, Pass::forward, target).ok()) {
            ++tally[label].declined;
            continue;
          }
          ++tally[label].ran;
          const AttentionSpec& s = p32.spec;
          TensorView out_view = ref.out.view(), lse_view = ref.lse.view();
          out_view.dtype = lse_view.dtype = DType::f32;
          Tensor out = Tensor::zeros_like(out_view), lse = Tensor::zeros_like(lse_view);
          backend.forward(ForwardArgs{s, p32.inputs, out, lse, {}, target});
          SCOPED_TRACE(where);
          testing::expect_within_baseline("out", out, base.out, ref.out, 2, testing::max_abs(ref.out));
          testing::expect_within_baseline("lse", lse, base.lse, ref.lse, 2, testing::max_abs(ref.lse));
          if (!backend.check(s, Pass::backward, target).ok()) {
            ++tally[label + " backward"].declined;
            continue;
          }
          ++tally[label + " backward"].ran;
          Tensor dq = Tensor::zeros_like(p32.q), dk = Tensor::zeros_like(p32.k), dv = Tensor::zeros_like(p32.v);
          Tensor dbias = s.bias_requires_grad ? Tensor::zeros_like(p32.bias) : Tensor{};
          Tensor dsinks = ref.dsinks.defined() ? Tensor::zeros(DType::f32, {s.heads_q}) : Tensor{};
          backend.backward(BackwardArgs{s, p32.inputs, out, lse, p32.dout, dq, dk, dv, dbias, {}, target, {}, dsinks});
          testing::expect_within_baseline("dq", dq, base.dq, ref.dq, 3, grads);
          testing::expect_within_baseline("dk", dk, base.dk, ref.dk, 3, grads);
          testing::expect_within_baseline("dv", dv, base.dv, ref.dv, 3, grads);
          if (dsinks.defined()) {
            testing::expect_within_baseline("dsinks", dsinks, base.dsinks, ref.dsinks, 3, testing::max_abs(ref.dsinks));
          }
        }
      }
    }
  }
  // The counts, so that a backend that declines everything shows.
  for (const auto& [label, t] : tally) {
    std::printf("conformance: %-28s ran %3d, declined %3d\n", label.c_str(), t.ran, t.declined);
    if (label.find(" backward") == std::string::npos) {
      EXPECT_GT(t.ran, 0) << label << " declined every case";
    }
  }
  // Every registered backend appears (one label per available variant).
  for (const RegisteredBackend& e : entries) {
    if (!e.backend->serves(DeviceKind::cpu)) continue;  // tested by its own suite, as above
    bool seen = false;
    for (const auto& [label, t] : tally) seen |= label.rfind(std::string(e.backend->name()) + ":", 0) == 0;
    EXPECT_TRUE(seen) << e.backend->name();
  }
}

// The build adds tests/backends/sample to this binary's backend list, through
// the same generated registration as the built-ins; the suite above tests it
// without naming it. This checks that the mechanism put it there.
TEST(Conformance, BackendFoldersInTheBuildListAreRegistered) {
  const auto entries = Registry::global().backends();
  EXPECT_GE(entries.size(), 4u);
  EXPECT_NE(Registry::global().find("sample"), nullptr);
}

}  // namespace
}  // namespace attend
