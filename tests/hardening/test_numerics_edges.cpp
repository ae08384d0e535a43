// Numerics at the edges, for every registered backend that takes the problem:
// huge logits, fully masked rows, seqlen 1, no keys, NaN/inf inputs, denormals.
// Finite edge cases must match the f64 reference; non-finite inputs must not
// crash or hang, must stay confined to the rows they reach, and propagate as
// documented in docs/hardening.md.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::PassResults;
using testing::Problem;

AttentionSpec base() {
  AttentionSpec s;
  s.batch = 1;
  s.seqlen_q = 6;
  s.seqlen_kv = 6;
  s.heads_q = 2;
  s.heads_kv = 2;
  s.head_dim_qk = 8;
  s.head_dim_v = 8;
  return s;
}

// Calls fn(backend, results, with_backward) for each backend that runs the problem.
void for_each_backend(const Problem& p, const std::function<void(const Backend&, const PassResults&, bool)>& fn) {
  for (const auto& e : Registry::global().backends()) {
    const Backend& b = *e.backend;
    if (!b.check(p.spec, Pass::forward).ok()) continue;
    const bool bwd = b.check(p.spec, Pass::backward).ok();
    SCOPED_TRACE(std::string(b.name()));
    fn(b, testing::run_backend(b, p, bwd), bwd);
  }
}

void expect_close_to_reference(const Problem& p, double tol, double grad_tol = 0) {
  if (grad_tol == 0) grad_tol = tol;
  const PassResults want = testing::run_backend(*make_reference_backend(), p, true);
  for_each_backend(p, [&](const Backend&, const PassResults& got, bool bwd) {
    EXPECT_LE(testing::max_abs_diff(got.out, want.out), tol * (1 + testing::max_abs(want.out)));
    EXPECT_LE(testing::max_abs_diff(got.lse, want.lse), tol * (1 + testing::max_abs(want.lse)));
    if (bwd) {
      EXPECT_LE(testing::max_abs_diff(got.dq, want.dq), grad_tol * (1 + testing::max_abs(want.dq)));
      EXPECT_LE(testing::max_abs_diff(got.dk, want.dk), grad_tol * (1 + testing::max_abs(want.dk)));
      EXPECT_LE(testing::max_abs_diff(got.dv, want.dv), grad_tol * (1 + testing::max_abs(want.dv)));
    }
  });
}

bool all_finite(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.as<float>()[i])) return false;
  return true;
}

TEST(NumericsEdges, HugeLogitsStayFiniteAndMatchReference) {
  AttentionSpec s = base();
  s.scale = 1e3;  // |q.k| ~ 3 with unit normals: |s| ~ 1e3 .. 1e4
  const Problem p = testing::make_problem(s, 1);
  for_each_backend(p, [&](const Backend&, const PassResults& r, bool bwd) {
    EXPECT_TRUE(all_finite(r.out));
    EXPECT_TRUE(all_finite(r.lse));
    EXPECT_GT(testing::max_abs(r.lse), 1e3);
    if (bwd) {
      EXPECT_TRUE(all_finite(r.dq));
    }
  });
  // f32 logits of size 1e4 carry rounding of 1e4 * 2^-24 ~ 6e-4, which the
  // gradients (scaled by `scale` again) inherit; the forward stays at 1e-4.
  expect_close_to_reference(p, 1e-4, 5e-3);
}

TEST(NumericsEdges, FullyMaskedRowsGiveZeroOutputMinusInfLseAndNoGradient) {
  AttentionSpec s = base();
  s.seqlen_q = 8;
  s.seqlen_kv = 3;
  s.causal = true;  // bottom-right: rows 0..4 see no key
  const Problem p = testing::make_problem(s, 2);
  for_each_backend(p, [&](const Backend&, const PassResults& r, bool bwd) {
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      for (std::int64_t i = 0; i < 5; ++i) {
        EXPECT_EQ(r.lse.as<float>()[h * s.seqlen_q + i], -std::numeric_limits<float>::infinity());
        for (std::int64_t d = 0; d < s.head_dim_v; ++d) {
          EXPECT_EQ(r.out.as<float>()[(i * s.heads_q + h) * s.head_dim_v + d], 0.0f);
          if (bwd) {
            EXPECT_EQ(r.dq.as<float>()[(i * s.heads_q + h) * s.head_dim_qk + d], 0.0f);
          }
        }
      }
    }
  });
  expect_close_to_reference(p, 1e-5);
}

TEST(NumericsEdges, SeqlenOneMatchesReference) {
  AttentionSpec s = base();
  s.seqlen_q = 1;
  s.seqlen_kv = 1;
  expect_close_to_reference(testing::make_problem(s, 3), 1e-5);
  s.seqlen_kv = 37;
  expect_close_to_reference(testing::make_problem(s, 4), 1e-5);
}

TEST(NumericsEdges, NoKeysGiveZeroOutputAndMinusInfLse) {
  AttentionSpec s = base();
  s.seqlen_kv = 0;
  const Problem p = testing::make_problem(s, 5);
  for_each_backend(p, [&](const Backend&, const PassResults& r, bool bwd) {
    EXPECT_EQ(testing::max_abs(r.out), 0.0);
    for (std::int64_t i = 0; i < r.lse.numel(); ++i)
      EXPECT_EQ(r.lse.as<float>()[i], -std::numeric_limits<float>::infinity());
    if (bwd) {
      EXPECT_EQ(testing::max_abs(r.dq), 0.0);
    }
  });
}

TEST(NumericsEdges, DenormalInputsMatchReference) {
  AttentionSpec s = base();
  Problem p = testing::make_problem(s, 6);
  for (std::int64_t i = 0; i < p.q.numel(); ++i) p.q.as<float>()[i] *= 1e-39f;  // subnormal q
  for (std::int64_t i = 0; i < p.v.numel(); ++i) p.v.as<float>()[i] *= 1e-39f;  // subnormal v
  const PassResults want = testing::run_backend(*make_reference_backend(), p, false);
  for_each_backend(p, [&](const Backend&, const PassResults& r, bool) {
    EXPECT_TRUE(all_finite(r.out));
    // Subnormal outputs may be flushed or kept: compare on the absolute scale of v.
    EXPECT_LE(testing::max_abs_diff(r.out, want.out), 1e-44);
    EXPECT_LE(testing::max_abs_diff(r.lse, want.lse), 1e-5);
  });
}

// Non-finite input in one element of q (query row 2, head 0): that row's
// output and LSE may be poisoned, every other row must equal the clean run.
void expect_confined(float bad, bool in_k) {
  AttentionSpec s = base();
  const Problem clean = testing::make_problem(s, 7);
  Problem dirty = testing::make_problem(s, 7);
  // bshd: element (b=0, row 2, head 0, d=0)
  const std::int64_t at = (2 * s.heads_q + 0) * s.head_dim_qk;
  (in_k ? dirty.k : dirty.q).as<float>()[at] = bad;
  const auto row_finite = [&](const Tensor& out, std::int64_t i, std::int64_t h) {
    for (std::int64_t dd = 0; dd < s.head_dim_v; ++dd) {
      if (!std::isfinite(out.as<float>()[(i * s.heads_q + h) * s.head_dim_v + dd])) return false;
    }
    return true;
  };
  for (const auto& e : Registry::global().backends()) {
    const Backend& b = *e.backend;
    if (!b.check(s, Pass::forward).ok()) continue;
    SCOPED_TRACE(std::string(b.name()));
    const PassResults c = testing::run_backend(b, clean, false), d = testing::run_backend(b, dirty, false);
    for (std::int64_t i = 0; i < s.seqlen_q; ++i) {
      for (std::int64_t h = 0; h < s.heads_q; ++h) {
        const bool reached = h == 0 && (in_k || i == 2);  // a bad key reaches every row of its head
        const float lc = c.lse.as<float>()[h * s.seqlen_q + i], ld = d.lse.as<float>()[h * s.seqlen_q + i];
        if (!reached) {
          EXPECT_EQ(lc, ld) << "row " << i << " head " << h;
        } else {
          // No backend hides a non-finite input: the row's LSE is NaN or
          // infinite, and its output is non-finite too unless the row reads as
          // fully masked (LSE -inf, output 0: e.g. all its logits NaN).
          // docs/hardening.md "NaN/inf propagation".
          EXPECT_FALSE(std::isfinite(ld)) << "row " << i << " head " << h << " lse " << ld;
          if (row_finite(d.out, i, h)) {
            EXPECT_EQ(ld, -std::numeric_limits<float>::infinity()) << "row " << i << " head " << h;
          }
        }
      }
    }
  }
}

TEST(NumericsEdges, NanInQueryPoisonsOnlyItsRow) { expect_confined(std::numeric_limits<float>::quiet_NaN(), false); }
TEST(NumericsEdges, InfInQueryPoisonsOnlyItsRow) { expect_confined(std::numeric_limits<float>::infinity(), false); }
TEST(NumericsEdges, NanInKeyPoisonsOnlyRowsThatSeeIt) { expect_confined(std::numeric_limits<float>::quiet_NaN(), true); }

}  // namespace
}  // namespace attend
